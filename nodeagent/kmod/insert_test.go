package kmod

import (
	"bytes"
	"compress/gzip"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/klauspost/compress/zstd"
	"github.com/ulikunitz/xz"
)

func TestCompression(t *testing.T) {
	for path, want := range map[string]string{
		"kernel/net/netfilter/ipvs/ip_vs.ko":     "",
		"kernel/net/netfilter/ipvs/ip_vs.ko.gz":  "gzip",
		"kernel/net/netfilter/ipvs/ip_vs.ko.xz":  "xz",
		"kernel/net/netfilter/ipvs/ip_vs.ko.zst": "zstd",
	} {
		if got, err := compression(path); err != nil || got != want {
			t.Errorf("compression(%q) = %q, %v; want %q", path, got, err, want)
		}
	}
	if _, err := compression("kernel/ip_vs.ko.bz2"); err == nil {
		t.Error("compression(.ko.bz2) succeeded; want an error")
	}
}

// compressors write each format the way depmod's trees hold them.
var compressors = map[string]func(io.Writer) (io.WriteCloser, error){
	"gzip": func(w io.Writer) (io.WriteCloser, error) { return gzip.NewWriter(w), nil },
	"xz":   func(w io.Writer) (io.WriteCloser, error) { return xz.NewWriter(w) },
	"zstd": func(w io.Writer) (io.WriteCloser, error) { return zstd.NewWriter(w) },
}

func TestDecompress(t *testing.T) {
	// An ELF-looking image big enough to span several blocks.
	image := bytes.Repeat([]byte("\x7fELF module image "), 50000)
	for comp, newWriter := range compressors {
		t.Run(comp, func(t *testing.T) {
			var buf bytes.Buffer
			w, err := newWriter(&buf)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := w.Write(image); err != nil {
				t.Fatal(err)
			}
			if err := w.Close(); err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(t.TempDir(), "m.ko."+comp)
			if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
				t.Fatal(err)
			}
			got, err := decompress(path, comp)
			if err != nil {
				t.Fatalf("decompress: %v", err)
			}
			if !bytes.Equal(got, image) {
				t.Errorf("decompress gave %d bytes; want the %d written", len(got), len(image))
			}
			// A corrupt file is an error naming it, not a module.
			if err := os.WriteFile(path, buf.Bytes()[:buf.Len()/2], 0o644); err != nil {
				t.Fatal(err)
			}
			if _, err := decompress(path, comp); err == nil {
				t.Error("decompress of a truncated file succeeded")
			}
		})
	}
}

func TestDecompressUnknownFormat(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.ko.bz2")
	if err := os.WriteFile(path, []byte("BZh"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := decompress(path, "bzip2"); err == nil {
		t.Error("decompress(bzip2) succeeded; want an error")
	}
}

func TestKernelDecompresses(t *testing.T) {
	sys := t.TempDir()
	ix := &index{sysModule: sys}
	if ix.kernelDecompresses("zstd") {
		t.Error("kernelDecompresses(zstd) without /sys/module/compression; want false")
	}
	if err := os.WriteFile(filepath.Join(sys, "compression"), []byte("zstd\n"), 0o444); err != nil {
		t.Fatal(err)
	}
	if !ix.kernelDecompresses("zstd") || ix.kernelDecompresses("xz") {
		t.Error("with compression=zstd: want zstd by the kernel, xz here")
	}
}
