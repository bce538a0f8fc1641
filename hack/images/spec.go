package main

import (
	"fmt"
	"os"
	"strings"

	"sigs.k8s.io/yaml"
)

// Spec describes one image: what goes into it and how it runs. The
// project's own images are described by images/<name>/image.yaml; the
// same fields can be given as flags for the test cluster's helper images.
type Spec struct {
	// Ref is the image reference the archive carries, such as
	// ghcr.io/proxyshift/proxyshift-agent:dev.
	Ref string `json:"ref"`
	// Build lists Go main packages compiled (static, -trimpath) into the
	// image.
	Build []GoBinary `json:"build,omitempty"`
	// Packages lists files naming Debian packages, unpacked with their
	// dependency closure by hack/images/debs.sh into the first layer.
	Packages []string `json:"packages,omitempty"`
	// Files are host files copied in.
	Files []File `json:"files,omitempty"`
	// Symlinks are links created in the image.
	Symlinks []Symlink `json:"symlinks,omitempty"`
	// Entrypoint, User and Env become the image config.
	Entrypoint []string `json:"entrypoint,omitempty"`
	User       string   `json:"user,omitempty"`
	Env        []string `json:"env,omitempty"`
}

// GoBinary is a Go main package built into the image at Dest.
type GoBinary struct {
	Package string `json:"package"`
	Dest    string `json:"dest"`
}

// File is a host file (Src) copied to Dest, keeping its mode.
type File struct {
	Src  string `json:"src"`
	Dest string `json:"dest"`
}

// Symlink is a link at Path pointing to Target.
type Symlink struct {
	Path   string `json:"path"`
	Target string `json:"target"`
}

// loadSpec reads an image.yaml.
func loadSpec(path string) (Spec, error) {
	var s Spec
	b, err := os.ReadFile(path)
	if err != nil {
		return s, err
	}
	if err := yaml.UnmarshalStrict(b, &s); err != nil {
		return s, fmt.Errorf("%s: %w", path, err)
	}
	return s, nil
}

// validate reports the first thing that makes s unbuildable.
func (s Spec) validate() error {
	if s.Ref == "" || !strings.Contains(s.Ref, ":") {
		return fmt.Errorf("ref %q: want NAME:TAG", s.Ref)
	}
	for _, b := range s.Build {
		if b.Package == "" || !strings.HasPrefix(b.Dest, "/") {
			return fmt.Errorf("build %+v: want a package and an absolute dest", b)
		}
	}
	for _, f := range s.Files {
		if f.Src == "" || !strings.HasPrefix(f.Dest, "/") {
			return fmt.Errorf("file %+v: want a source and an absolute dest", f)
		}
	}
	for _, l := range s.Symlinks {
		if !strings.HasPrefix(l.Path, "/") || l.Target == "" {
			return fmt.Errorf("symlink %+v: want an absolute path and a target", l)
		}
	}
	if len(s.Entrypoint) == 0 {
		return fmt.Errorf("no entrypoint")
	}
	return nil
}

// pair splits "A=B" flag values.
func pair(v, what string) (string, string, error) {
	a, b, ok := strings.Cut(v, "=")
	if !ok || a == "" || b == "" {
		return "", "", fmt.Errorf("%s %q: want A=B", what, v)
	}
	return a, b, nil
}
