package kmod

import (
	"compress/gzip"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/klauspost/compress/zstd"
	"github.com/ulikunitz/xz"
	"golang.org/x/sys/unix"
)

// maxImage bounds a decompressed module (the largest in-tree modules are
// tens of MiB), so that a corrupt file cannot exhaust the agent's memory.
const maxImage = 256 << 20

// compression is the compression of a module file, named as
// /sys/module/compression names it: "" (none), "gzip", "xz" or "zstd".
func compression(path string) (string, error) {
	base := filepath.Base(path)
	switch {
	case strings.HasSuffix(base, ".ko"):
		return "", nil
	case strings.HasSuffix(base, ".ko.gz"):
		return "gzip", nil
	case strings.HasSuffix(base, ".ko.xz"):
		return "xz", nil
	case strings.HasSuffix(base, ".ko.zst"):
		return "zstd", nil
	}
	return "", fmt.Errorf("%s: not a module file (.ko, .ko.gz, .ko.xz or .ko.zst)", path)
}

// kernelDecompresses says whether the kernel decompresses modules of this
// format itself: /sys/module/compression exists (CONFIG_MODULE_DECOMPRESS)
// and names it.
func (ix *index) kernelDecompresses(comp string) bool {
	data, err := os.ReadFile(filepath.Join(ix.sysModule, "compression"))
	return err == nil && strings.TrimSpace(string(data)) == comp
}

// insertFile loads one module file into the kernel: with finit_module when
// the kernel can read the file as it is, else by decompressing it here and
// handing the image to init_module.
func (ix *index) insertFile(path string) error {
	comp, err := compression(path)
	if err != nil {
		return err
	}
	if comp == "" || ix.kernelDecompresses(comp) {
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		flags := 0
		if comp != "" {
			flags = unix.MODULE_INIT_COMPRESSED_FILE
		}
		return unix.FinitModule(int(f.Fd()), "", flags)
	}
	image, err := decompress(path, comp)
	if err != nil {
		return err
	}
	return unix.InitModule(image, "")
}

// decompress reads a compressed module file into memory.
func decompress(path, comp string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var r io.Reader
	switch comp {
	case "gzip":
		zr, err := gzip.NewReader(f)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		r = zr
	case "xz":
		xr, err := xz.NewReader(f)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		r = xr
	case "zstd":
		zr, err := zstd.NewReader(f, zstd.WithDecoderConcurrency(1))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		defer zr.Close()
		r = zr
	default:
		return nil, fmt.Errorf("%s: unsupported compression %q", path, comp)
	}
	image, err := io.ReadAll(io.LimitReader(r, maxImage+1))
	if err != nil {
		return nil, fmt.Errorf("decompress %s: %w", path, err)
	}
	if len(image) > maxImage {
		return nil, fmt.Errorf("decompress %s: larger than %d MiB", path, maxImage>>20)
	}
	return image, nil
}
