package main

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// tree is the file system of one layer, keyed by clean absolute path. It
// is written as a tar whose bytes depend only on the entries: sorted
// paths, owner root, one fixed modification time. That is what makes two
// builds of the same inputs give the same layer digest.
type tree map[string]entry

// entry is one file system object: a directory, a regular file (its
// content read from src when written) or a symlink.
type entry struct {
	typ    byte // tar.TypeDir, tar.TypeReg or tar.TypeSymlink
	mode   fs.FileMode
	src    string
	target string
}

// addParents adds the missing parent directories of p (mode 0755).
func (t tree) addParents(p string) {
	for d := path.Dir(p); d != "/"; d = path.Dir(d) {
		if _, ok := t[d]; !ok {
			t[d] = entry{typ: tar.TypeDir, mode: 0o755}
		}
	}
}

// addFile adds host file src at dest, keeping its permission bits.
func (t tree) addFile(src, dest string) error {
	info, err := os.Stat(src)
	if err != nil {
		return err
	}
	if !info.Mode().IsRegular() {
		return fmt.Errorf("%s: not a regular file", src)
	}
	dest = path.Clean(dest)
	t.addParents(dest)
	t[dest] = entry{typ: tar.TypeReg, mode: info.Mode().Perm(), src: src}
	return nil
}

// addSymlink adds a link at p pointing to target.
func (t tree) addSymlink(p, target string) {
	p = path.Clean(p)
	t.addParents(p)
	t[p] = entry{typ: tar.TypeSymlink, mode: 0o777, target: target}
}

// addDir adds everything under the host directory root, as if root were
// "/" (root itself is not an entry). Device files and sockets are refused:
// nothing an image needs is one.
func (t tree) addDir(root string) error {
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == root {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		dest := "/" + filepath.ToSlash(rel)
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			t[dest] = entry{typ: tar.TypeDir, mode: info.Mode().Perm()}
		case d.Type()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			t[dest] = entry{typ: tar.TypeSymlink, mode: 0o777, target: target}
		case d.Type().IsRegular():
			t[dest] = entry{typ: tar.TypeReg, mode: info.Mode().Perm(), src: p}
		default:
			return fmt.Errorf("%s: %s is not a file, directory or symlink", p, d.Type())
		}
		return nil
	})
}

// writeTar writes t as a tar to w, entries in path order (parents first),
// every entry owned by root and dated mtime.
func (t tree) writeTar(w io.Writer, mtime time.Time) error {
	paths := make([]string, 0, len(t))
	for p := range t {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	tw := tar.NewWriter(w)
	for _, p := range paths {
		e := t[p]
		h := &tar.Header{
			Typeflag: e.typ,
			Name:     strings.TrimPrefix(p, "/"),
			Mode:     int64(e.mode),
			ModTime:  mtime,
			Linkname: e.target,
			Format:   tar.FormatPAX,
		}
		var content []byte
		switch e.typ {
		case tar.TypeDir:
			h.Name += "/"
		case tar.TypeReg:
			b, err := os.ReadFile(e.src)
			if err != nil {
				return err
			}
			content, h.Size = b, int64(len(b))
		}
		if err := tw.WriteHeader(h); err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		if _, err := tw.Write(content); err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
	}
	return tw.Close()
}

// tarBytes is writeTar into memory.
func (t tree) tarBytes(mtime time.Time) ([]byte, error) {
	var buf bytes.Buffer
	err := t.writeTar(&buf, mtime)
	return buf.Bytes(), err
}
