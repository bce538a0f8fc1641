package realcluster

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
	"github.com/proxyshift/proxyshift/test/harness"
)

// InstallProxyshift installs proxyshift the way the README tells a user
// of a cluster without a registry: `make images`, import both archives
// into every node's containerd, `kubectl apply -k config/local`, then it
// waits until the operator and every agent are rolled out. It returns how
// long the steps took.
func (c *Cluster) InstallProxyshift(ctx context.Context) ([]harness.Timing, error) {
	var timings []harness.Timing
	start := time.Now()
	make := exec.CommandContext(ctx, "make", "images")
	make.Dir = c.opts.RepoDir
	if out, err := make.CombinedOutput(); err != nil {
		return timings, fmt.Errorf("make images: %w\n%s", err, out)
	}
	timings = append(timings, harness.Timing{Step: "make images", Duration: time.Since(start)})
	start = time.Now()
	for _, name := range []string{"proxyshift-operator", "proxyshift-agent"} {
		if err := c.ImportImage(ctx, filepath.Join(c.opts.RepoDir, "bin", "images", name+".oci.tar")); err != nil {
			return timings, err
		}
	}
	timings = append(timings, harness.Timing{Step: "import the images on every node", Duration: time.Since(start)})
	start = time.Now()
	if out, err := c.Kubectl(ctx, "apply", "-k", filepath.Join(c.opts.RepoDir, "config", "local")); err != nil {
		return timings, fmt.Errorf("kubectl apply -k config/local: %w\n%s", err, out)
	}
	for _, w := range []string{"deployment/proxyshift-operator", "daemonset/proxyshift-agent"} {
		if out, err := c.Kubectl(ctx, "-n", "proxyshift-system", "rollout", "status", w, "--timeout=5m"); err != nil {
			pods, _ := c.Kubectl(ctx, "-n", "proxyshift-system", "get", "pods", "-o", "wide")
			desc, _ := c.Kubectl(ctx, "-n", "proxyshift-system", "describe", "pods")
			return timings, fmt.Errorf("%s not ready: %w\n%s\n%s\n%s", w, err, out, pods, desc)
		}
	}
	timings = append(timings, harness.Timing{Step: "kubectl apply -k config/local until every pod is Ready", Duration: time.Since(start)})
	return timings, nil
}

// ProxyshiftClient is a client of the cluster's API server that knows
// Kubernetes' kinds and proxyshift's.
func (c *Cluster) ProxyshiftClient() (client.Client, error) {
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return nil, err
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	return client.New(c.Config, client.Options{Scheme: scheme})
}
