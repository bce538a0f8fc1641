package realcluster

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// The images every node imports at start (manifests/ and the containerd
// configuration name them); test/realcluster/images/<name>.yaml describe
// them for hack/images.
const (
	// pauseImage is containerd's sandbox image (under its default name):
	// this package's pause.
	pauseImage = "registry.k8s.io/pause:3.10.2"
	// PodserverImage is the Deployment's backend (podserver).
	PodserverImage = "proxyshift.local/podserver:test"
)

// imageSpecs are the images' specs, in test/realcluster/images.
var imageSpecs = []string{"pause", "kube-proxy", "podserver"}

// buildImages builds the pause binary the nodes' PID namespaces run as
// init, and with hack/images the OCI archives of the images every node
// imports (into RunDir/images): pause, kube-proxy (the binary from
// BinDir, the userland from Debian packages, which hack/images caches) and
// podserver.
func (c *Cluster) buildImages(ctx context.Context) error {
	bin := filepath.Join(c.RunDir, "bin")
	c.pauseBin = filepath.Join(bin, "pause")
	tool := filepath.Join(bin, "images")
	for _, b := range []struct{ out, pkg string }{{c.pauseBin, "./test/realcluster/pause"}, {tool, "./hack/images"}} {
		cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-o", b.out, b.pkg)
		cmd.Dir = c.opts.RepoDir
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("go build %s: %w\n%s", b.pkg, err, out)
		}
	}
	kubeProxy, err := filepath.EvalSymlinks(filepath.Join(c.BinDir, "kube-proxy"))
	if err != nil {
		return err
	}
	c.Images = nil
	for _, name := range imageSpecs {
		archive := filepath.Join(c.RunDir, "images", name+".oci.tar")
		args := []string{"-spec", filepath.Join("test", "realcluster", "images", name+".yaml"), "-out", archive}
		if name == "kube-proxy" {
			args = append(args, "-file", kubeProxy+"=/usr/local/bin/kube-proxy")
		}
		cmd := exec.CommandContext(ctx, tool, args...)
		cmd.Dir = c.opts.RepoDir
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("hack/images %s: %w\n%s", strings.Join(args, " "), err, out)
		}
		c.Images = append(c.Images, archive)
	}
	return nil
}
