// Command images builds container images as OCI image archives (an OCI
// image layout packed in a tar, importable with `ctr -n k8s.io images
// import`) on a machine with no Docker daemon and no registry.
//
// Why: the machines proxyshift is developed and tested on reach only the
// Go module proxy and Debian's archive, and have no container engine. The
// images are assembled with go-containerregistry from static Go binaries
// and the files of Debian packages, so `make images` needs nothing else.
// Every layer is a tar of sorted entries owned by root and dated
// SOURCE_DATE_EPOCH, so the same inputs always give the same digest.
//
// An image is described by a spec (images/<name>/image.yaml for the
// project's own images) and/or flags:
//
//	images -spec images/agent/image.yaml -out bin/images/proxyshift-agent.oci.tar
//	images -ref registry.k8s.io/pause:3.10 -file bin/pause=/pause -entrypoint /pause -out pause.oci.tar
//	images -spec images/agent/image.yaml -dockerfile > images/agent/Dockerfile
//
// The userland of Debian packages is unpacked by hack/images/debs.sh, the
// same script the generated Dockerfiles run, so that `docker build` gives
// the same files. It prints the image's manifest digest.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// listFlag collects a repeatable flag.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "images:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fl := flag.NewFlagSet("images", flag.ContinueOnError)
	var (
		specPath                                = fl.String("spec", "", "image.yaml describing the image; flags add to it")
		ref                                     = fl.String("ref", "", "image reference NAME:TAG recorded in the archive (overrides the spec's)")
		out                                     = fl.String("out", "", "OCI archive (.oci.tar) to write")
		user                                    = fl.String("user", "", "user (UID[:GID]) the image runs as")
		dockerfile                              = fl.Bool("dockerfile", false, "print the Dockerfile equivalent to the spec instead of building")
		debs                                    = fl.String("debs-script", "hack/images/debs.sh", "the script that unpacks Debian packages")
		files, links, packages, entrypoint, env listFlag
	)
	fl.Var(&files, "file", "SRC=DEST: copy host file SRC to DEST (repeatable)")
	fl.Var(&links, "symlink", "LINK=TARGET: create symlink LINK -> TARGET (repeatable)")
	fl.Var(&packages, "packages", "file listing Debian packages to unpack with their dependencies (repeatable)")
	fl.Var(&entrypoint, "entrypoint", "entrypoint argument (repeatable, in order)")
	fl.Var(&env, "env", "K=V environment variable (repeatable)")
	if err := fl.Parse(args); err != nil {
		return err
	}

	var s Spec
	if *specPath != "" {
		var err error
		if s, err = loadSpec(*specPath); err != nil {
			return err
		}
	}
	if *ref != "" {
		s.Ref = *ref
	}
	if *user != "" {
		s.User = *user
	}
	for _, f := range files {
		src, dest, err := pair(f, "-file")
		if err != nil {
			return err
		}
		s.Files = append(s.Files, File{Src: src, Dest: dest})
	}
	for _, l := range links {
		p, target, err := pair(l, "-symlink")
		if err != nil {
			return err
		}
		s.Symlinks = append(s.Symlinks, Symlink{Path: p, Target: target})
	}
	s.Packages = append(s.Packages, packages...)
	if len(entrypoint) > 0 {
		s.Entrypoint = entrypoint
	}
	s.Env = append(s.Env, env...)
	if err := s.validate(); err != nil {
		return err
	}
	if *dockerfile {
		return renderDockerfile(os.Stdout, s)
	}
	if *out == "" {
		return errors.New("-out is required")
	}
	digest, err := build(s, *out, *debs)
	if err != nil {
		return err
	}
	fmt.Println(digest)
	return nil
}

// build writes the image s describes to out and returns its digest.
func build(s Spec, out, debsScript string) (string, error) {
	created, err := sourceDate()
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return "", err
	}
	work, err := os.MkdirTemp("", "proxyshift-image-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(work)

	var layers []layerStep
	if len(s.Packages) > 0 {
		rootfs := filepath.Join(work, "rootfs")
		for _, list := range s.Packages {
			fmt.Fprintf(os.Stderr, "images: %s: unpacking the packages of %s\n", s.Ref, list)
			cmd := exec.Command(debsScript, list, rootfs)
			cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
			if err := cmd.Run(); err != nil {
				return "", fmt.Errorf("debs.sh %s: %w", list, err)
			}
		}
		userland := tree{}
		if err := userland.addDir(rootfs); err != nil {
			return "", err
		}
		layers = append(layers, layerStep{files: userland, createdBy: "debs.sh " + strings.Join(s.Packages, " ")})
	}

	own := tree{}
	for i, b := range s.Build {
		bin := filepath.Join(work, "bin", strconv.Itoa(i))
		fmt.Fprintf(os.Stderr, "images: %s: go build %s\n", s.Ref, b.Package)
		cmd := exec.Command("go", append(append([]string{"build"}, goBuildFlags...), "-o", bin, b.Package)...)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			return "", fmt.Errorf("go build %s: %w", b.Package, err)
		}
		if err := own.addFile(bin, b.Dest); err != nil {
			return "", err
		}
	}
	for _, f := range s.Files {
		if err := own.addFile(f.Src, f.Dest); err != nil {
			return "", err
		}
	}
	for _, l := range s.Symlinks {
		own.addSymlink(l.Path, l.Target)
	}
	if len(own) > 0 {
		layers = append(layers, layerStep{files: own, createdBy: "proxyshift hack/images: binaries and files"})
	}

	img, err := assemble(s, layers, created)
	if err != nil {
		return "", err
	}
	if err := writeArchive(img, s.Ref, out, created); err != nil {
		return "", err
	}
	d, err := img.Digest()
	return d.String(), err
}

// goBuildFlags are the flags of every Go binary in an image, here and in
// the generated Dockerfiles: static and free of build paths, so the binary
// depends only on the sources.
var goBuildFlags = []string{"-trimpath", "-buildvcs=false", "-ldflags=-s -w"}

// sourceDate is the time every file and history entry carries:
// $SOURCE_DATE_EPOCH (the Makefile passes the commit's date), else 0.
func sourceDate() (time.Time, error) {
	v := os.Getenv("SOURCE_DATE_EPOCH")
	if v == "" {
		return time.Unix(0, 0).UTC(), nil
	}
	sec, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("SOURCE_DATE_EPOCH %q: %w", v, err)
	}
	return time.Unix(sec, 0).UTC(), nil
}
