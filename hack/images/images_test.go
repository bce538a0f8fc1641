package main

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/layout"
	"golang.org/x/sys/unix"
)

// writeFile creates path with content and mode, and its directory.
func writeFile(t *testing.T, path, content string, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
}

// tarEntries lists a tar's headers by name.
func tarEntries(t *testing.T, r io.Reader) map[string]*tar.Header {
	t.Helper()
	out := map[string]*tar.Header{}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		out[h.Name] = h
	}
}

func TestTreeTarIsDeterministic(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "usr/sbin/tool"), "#!/bin/sh\n", 0o755)
	writeFile(t, filepath.Join(dir, "etc/protocols"), "tcp 6\n", 0o644)
	if err := os.Symlink("tool", filepath.Join(dir, "usr/sbin/tool-alias")); err != nil {
		t.Fatal(err)
	}
	mtime := time.Unix(1700000000, 0)
	build := func() []byte {
		tr := tree{}
		if err := tr.addDir(dir); err != nil {
			t.Fatal(err)
		}
		tr.addSymlink("/usr/local/bin/extra", "/usr/sbin/tool")
		b, err := tr.tarBytes(mtime)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	first := build()
	// Touching a file changes its host mtime and nothing in the layer.
	later := time.Now().Add(time.Hour)
	if err := os.Chtimes(filepath.Join(dir, "etc/protocols"), later, later); err != nil {
		t.Fatal(err)
	}
	if second := build(); !bytes.Equal(first, second) {
		t.Fatal("the same tree gave two different tars")
	}

	entries := tarEntries(t, bytes.NewReader(first))
	for name, want := range map[string]byte{
		"etc/": tar.TypeDir, "etc/protocols": tar.TypeReg, "usr/sbin/tool": tar.TypeReg,
		"usr/sbin/tool-alias": tar.TypeSymlink, "usr/local/": tar.TypeDir, "usr/local/bin/extra": tar.TypeSymlink,
	} {
		h, ok := entries[name]
		if !ok {
			t.Errorf("tar lacks %s; has %v", name, entries)
			continue
		}
		if h.Typeflag != want || h.Uid != 0 || h.Gid != 0 || !h.ModTime.Equal(mtime) {
			t.Errorf("%s: type %c uid %d gid %d mtime %v; want type %c, root, %v", name, h.Typeflag, h.Uid, h.Gid, h.ModTime, want, mtime)
		}
	}
	if h := entries["usr/sbin/tool"]; h != nil && h.Mode != 0o755 {
		t.Errorf("usr/sbin/tool mode %o, want 755", h.Mode)
	}
}

func TestAddDirRefusesDeviceFiles(t *testing.T) {
	dir := t.TempDir()
	if err := os.Symlink("/dev/null", filepath.Join(dir, "ok")); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(dir, "fifo")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Skipf("cannot make a FIFO here: %v", err)
	}
	if err := (tree{}).addDir(dir); err == nil || !strings.Contains(err.Error(), "fifo") {
		t.Fatalf("addDir over a FIFO: %v, want an error naming it", err)
	}
}

// TestBuildIsReproducibleAndImportable builds a files-only image twice and
// reads the archive back as an OCI layout: same digest both times, the
// names containerd's importer reads, the run settings and the files.
func TestBuildIsReproducibleAndImportable(t *testing.T) {
	t.Setenv("SOURCE_DATE_EPOCH", "1700000000")
	dir := t.TempDir()
	bin := filepath.Join(dir, "pause")
	writeFile(t, bin, "not really a binary", 0o755)
	s := Spec{
		Ref:        "registry.example/test/pause:3.10",
		Files:      []File{{Src: bin, Dest: "/pause"}},
		Symlinks:   []Symlink{{Path: "/bin/pause", Target: "/pause"}},
		Entrypoint: []string{"/pause"},
		User:       "65535:65535",
		Env:        []string{"A=b"},
	}
	if err := s.validate(); err != nil {
		t.Fatal(err)
	}
	first, err := build(s, filepath.Join(dir, "a", "pause.oci.tar"), "unused")
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, bin, "not really a binary", 0o755) // new host mtime
	second, err := build(s, filepath.Join(dir, "b", "pause.oci.tar"), "unused")
	if err != nil {
		t.Fatal(err)
	}
	if first != second || !strings.HasPrefix(first, "sha256:") {
		t.Fatalf("digests %s and %s: want one sha256 digest", first, second)
	}

	// Unpack the archive and read it as an OCI image layout.
	layoutDir := filepath.Join(dir, "layout")
	f, err := os.Open(filepath.Join(dir, "a", "pause.oci.tar"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			b, _ := io.ReadAll(tr)
			writeFile(t, filepath.Join(layoutDir, h.Name), string(b), 0o644)
		}
	}
	idx, err := layout.ImageIndexFromPath(layoutDir)
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(im.Manifests) != 1 {
		t.Fatalf("index has %d manifests, want 1", len(im.Manifests))
	}
	desc := im.Manifests[0]
	if got := desc.Annotations["io.containerd.image.name"]; got != s.Ref {
		t.Errorf("io.containerd.image.name %q, want %q", got, s.Ref)
	}
	if got := desc.Annotations["org.opencontainers.image.ref.name"]; got != "3.10" {
		t.Errorf("org.opencontainers.image.ref.name %q, want the tag 3.10", got)
	}
	if desc.Digest.String() != first || desc.Platform == nil || desc.Platform.Architecture != "amd64" {
		t.Errorf("index entry %s %+v, want %s for linux/amd64", desc.Digest, desc.Platform, first)
	}
	img, err := idx.Image(desc.Digest)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(cf.Config.Entrypoint, " ") != "/pause" || cf.Config.User != "65535:65535" || strings.Join(cf.Config.Env, ",") != "A=b" || cf.OS != "linux" {
		t.Errorf("config %+v (os %s), want entrypoint /pause, user 65535:65535, env A=b, linux", cf.Config, cf.OS)
	}
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("layers %d (%v), want 1", len(layers), err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	entries := tarEntries(t, rc)
	if h := entries["pause"]; h == nil || h.Size != int64(len("not really a binary")) || h.Mode != 0o755 {
		t.Errorf("layer's pause entry %+v, want the file, mode 755", h)
	}
	if h := entries["bin/pause"]; h == nil || h.Linkname != "/pause" {
		t.Errorf("layer's bin/pause entry %+v, want a link to /pause", h)
	}
}

func TestDockerfileRefusesWhatDockerCannotCopy(t *testing.T) {
	s := Spec{Ref: "x:y", Files: []File{{Src: "/etc/hostname", Dest: "/h"}}, Entrypoint: []string{"/h"}}
	if err := renderDockerfile(io.Discard, s); err == nil {
		t.Error("a Dockerfile copying a host path outside the repository was rendered")
	}
	s = Spec{Ref: "x:y", Build: []GoBinary{{Package: "./cmd/agent", Dest: "/a"}}, Packages: []string{"images/agent/packages.txt"}, Entrypoint: []string{"/a"}}
	var b strings.Builder
	if err := renderDockerfile(&b, s); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"RUN debs.sh /tmp/packages-0.txt /rootfs", "COPY --from=build /out/0 /a", `ENTRYPOINT ["/a"]`, "-trimpath"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("Dockerfile lacks %q:\n%s", want, b.String())
		}
	}
}
