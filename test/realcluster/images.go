package realcluster

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// The images every node imports at start (manifests/ names them).
const (
	// pauseImage is containerd's sandbox image (its default name, set in
	// its configuration too): the pause binary of this package.
	pauseImage = "registry.k8s.io/pause:3.10.2"
	// kubeProxyImage is kube-proxy v1.37.2 with the userland it calls.
	kubeProxyImage = "registry.k8s.io/kube-proxy:v1.37.2"
	// PodserverImage is the Deployment's backend (podserver).
	PodserverImage = "proxyshift.local/podserver:test"
)

// image is one image archive to build with hack/images.
type image struct {
	// name is the archive's base name; ref its image reference.
	name, ref string
	// files are copied into the image: host path → path in the image.
	files [][2]string
	// packages is a list of Debian packages to unpack into it, if any.
	packages string
	// flags are hack/images' other flags (entrypoint, user, symlinks).
	flags []string
}

// args are hack/images' flags for img, besides -ref and -out.
func (img image) args() []string {
	var args []string
	for _, f := range img.files {
		args = append(args, "-file", f[0]+"="+f[1])
	}
	if img.packages != "" {
		args = append(args, "-packages", img.packages)
	}
	return append(args, img.flags...)
}

// buildImages builds the pause and podserver binaries from this source
// tree and the images every node imports (pause, kube-proxy, podserver)
// with hack/images, unless Options.ImagesDir already holds an archive
// built from the same inputs (the archive's name carries their hash).
func (c *Cluster) buildImages(ctx context.Context) error {
	bin := filepath.Join(c.RunDir, "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		return err
	}
	builds := []struct{ out, pkg string }{
		{"pause", "./test/realcluster/pause"},
		{"podserver", "./test/realcluster/podserver"},
		{"images", "./hack/images"},
	}
	for _, b := range builds {
		cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-buildvcs=false", "-o", filepath.Join(bin, b.out), b.pkg)
		cmd.Dir = c.opts.RepoDir
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("go build %s: %w\n%s", b.pkg, err, out)
		}
	}
	c.pauseBin = filepath.Join(bin, "pause")
	kubeProxy, err := filepath.EvalSymlinks(filepath.Join(c.BinDir, "kube-proxy"))
	if err != nil {
		return err
	}
	packages := filepath.Join(c.opts.RepoDir, "test", "realcluster", "images", "kube-proxy.packages")
	images := []image{
		{
			name: "pause", ref: pauseImage, files: [][2]string{{c.pauseBin, "/pause"}},
			flags: []string{"-entrypoint", "/pause", "-user", "65535"},
		},
		{
			name: "kube-proxy", ref: kubeProxyImage, files: [][2]string{{kubeProxy, "/usr/local/bin/kube-proxy"}},
			packages: packages,
			flags:    append([]string{"-entrypoint", "/usr/local/bin/kube-proxy"}, iptablesLinks()...),
		},
		{
			name: "podserver", ref: PodserverImage, files: [][2]string{{filepath.Join(bin, "podserver"), "/podserver"}},
			flags: []string{"-entrypoint", "/podserver", "-user", "65532"},
		},
	}
	if err := os.MkdirAll(c.opts.ImagesDir, 0o755); err != nil {
		return err
	}
	c.Images = nil
	for _, img := range images {
		archive, err := c.buildImage(ctx, filepath.Join(bin, "images"), img)
		if err != nil {
			return fmt.Errorf("image %s: %w", img.ref, err)
		}
		c.Images = append(c.Images, archive)
	}
	return nil
}

// iptablesLinks are the -symlink flags that make iptables, ip6tables and
// their -save and -restore in the kube-proxy image the nft backend's, as
// Debian's alternatives do on the host (dpkg-deb -x runs no maintainer
// scripts, so the image would otherwise have no plain "iptables").
func iptablesLinks() []string {
	var args []string
	for _, fam := range []string{"iptables", "ip6tables"} {
		for _, suffix := range []string{"", "-save", "-restore"} {
			args = append(args, "-symlink", fmt.Sprintf("/usr/sbin/%s%s=%s-nft%s", fam, suffix, fam, suffix))
		}
	}
	return args
}

// buildImage returns the cached archive for img, building it first when
// missing.
func (c *Cluster) buildImage(ctx context.Context, tool string, img image) (string, error) {
	key, err := imageKey(img)
	if err != nil {
		return "", err
	}
	archive := filepath.Join(c.opts.ImagesDir, fmt.Sprintf("%s-%s.oci.tar", img.name, key))
	if _, err := os.Stat(archive); err == nil {
		return archive, nil
	}
	tmp := archive + ".tmp"
	args := append([]string{"-ref", img.ref, "-out", tmp}, img.args()...)
	cmd := exec.CommandContext(ctx, tool, args...)
	cmd.Dir = c.opts.RepoDir
	if out, err := cmd.CombinedOutput(); err != nil {
		_ = os.Remove(tmp)
		return "", fmt.Errorf("hack/images %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	c.logf("built image %s: %s", img.ref, archive)
	return archive, os.Rename(tmp, archive)
}

// imageKey hashes what an image is made of: its reference, its flags,
// and the contents of its files (with their paths in the image) and of its
// package list. Host paths are left out: the binaries are built afresh in
// each run's directory.
func imageKey(img image) (string, error) {
	h := sha256.New()
	fmt.Fprintf(h, "%s\n%s\n", img.ref, strings.Join(img.flags, "\n"))
	hashFile := func(path string) error {
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = io.Copy(h, f)
		return err
	}
	for _, f := range img.files {
		fmt.Fprintf(h, "file %s\n", f[1])
		if err := hashFile(f[0]); err != nil {
			return "", err
		}
	}
	if img.packages != "" {
		fmt.Fprintf(h, "packages\n")
		if err := hashFile(img.packages); err != nil {
			return "", err
		}
	}
	return hex.EncodeToString(h.Sum(nil))[:12], nil
}
