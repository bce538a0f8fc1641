package main

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// The platform every image is built for: the agent and the operator are
// static linux/amd64 binaries and the Debian packages are amd64.
var platform = v1.Platform{OS: "linux", Architecture: "amd64"}

// layerStep is one layer's file system and the history line that says
// where it came from.
type layerStep struct {
	files     tree
	createdBy string
}

// assemble builds an OCI image from the layers (bottom first) and the
// run settings of s, every date set to created.
func assemble(s Spec, layers []layerStep, created time.Time) (v1.Image, error) {
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	for _, l := range layers {
		b, err := l.files.tarBytes(created)
		if err != nil {
			return nil, err
		}
		layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
			return io.NopCloser(bytes.NewReader(b)), nil
		}, tarball.WithMediaType(types.OCILayer))
		if err != nil {
			return nil, err
		}
		img, err = mutate.Append(img, mutate.Addendum{
			Layer:     layer,
			MediaType: types.OCILayer,
			History:   v1.History{Created: v1.Time{Time: created}, CreatedBy: l.createdBy},
		})
		if err != nil {
			return nil, err
		}
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = platform.OS, platform.Architecture
	cf.Created = v1.Time{Time: created}
	cf.Config.Entrypoint = s.Entrypoint
	cf.Config.User = s.User
	cf.Config.Env = s.Env
	return mutate.ConfigFile(img, cf)
}

// writeArchive writes img as an OCI image layout packed in a tar at out,
// named ref the way containerd's importer reads it (io.containerd.image.name
// the full reference, org.opencontainers.image.ref.name the tag).
func writeArchive(img v1.Image, ref, out string, created time.Time) error {
	dir, err := os.MkdirTemp(filepath.Dir(out), ".oci-layout-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return err
	}
	tag := ref[strings.LastIndex(ref, ":")+1:]
	if err := p.AppendImage(img, layout.WithPlatform(platform), layout.WithAnnotations(map[string]string{
		"io.containerd.image.name":          ref,
		"org.opencontainers.image.ref.name": tag,
	})); err != nil {
		return fmt.Errorf("write OCI layout: %w", err)
	}
	files := tree{}
	if err := files.addDir(dir); err != nil {
		return err
	}
	tmp := out + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	if err := files.writeTar(f, created); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, out)
}
