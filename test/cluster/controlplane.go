package cluster

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
	"github.com/proxyshift/proxyshift/test/controlplane"
	"github.com/proxyshift/proxyshift/test/netlab"
)

// The agents' and the operator's endpoints, on their namespace's loopback.
// The agent's own health port is its default's, 10266: kube-proxy's 10256
// is the agent's to serve (on every address) once it serves the node.
const (
	agentHealthzAddr  = "127.0.0.1:10266"
	agentMetricsAddr  = "127.0.0.1:10249"
	operatorMetrics   = "127.0.0.1:8080"
	operatorProbeAddr = "127.0.0.1:8081"
	// readyBudget bounds the waits for healthy agents and for answering
	// Services (machines busy with other tests are slow; a healthy one
	// needs a few seconds).
	readyBudget = 90 * time.Second
	// tokenLifetime is the ServiceAccount tokens' validity; a cluster
	// that runs longer needs a restart.
	tokenLifetime = 7 * 24 * time.Hour
)

// RepoRoot is the proxyshift source tree this package was compiled from.
func RepoRoot() string {
	_, file, _, _ := goruntime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// Build compiles proxyshift-operator and proxyshift-agent from repoDir
// into binDir (go's build cache makes a repeated build quick). Tests that
// start several clusters build once and pass Options.BinDir.
func Build(ctx context.Context, repoDir, binDir string) error {
	if err := os.MkdirAll(binDir, 0o755); err != nil {
		return err
	}
	for _, b := range []struct{ out, pkg string }{
		{"proxyshift-operator", "./cmd/operator"},
		{"proxyshift-agent", "./cmd/agent"},
	} {
		cmd := exec.CommandContext(ctx, "go", "build", "-o", filepath.Join(binDir, b.out), b.pkg)
		cmd.Dir = repoDir
		// The default cgo setting, as `go test` builds: the build cache the
		// tests filled serves this build too (CGO_ENABLED=0 would rebuild
		// all of client-go).
		cmd.Env = os.Environ()
		out, err := cmd.CombinedOutput()
		if err != nil {
			return fmt.Errorf("go build %s: %w\n%s", b.pkg, err, out)
		}
	}
	return nil
}

func checkBinaries(binDir string) error {
	for _, b := range []string{"proxyshift-operator", "proxyshift-agent"} {
		if _, err := os.Stat(filepath.Join(binDir, b)); err != nil {
			return fmt.Errorf("BinDir: %w", err)
		}
	}
	return nil
}

// findAssets locates kube-apiserver, etcd and kubectl: in dir, else in
// $KUBEBUILDER_ASSETS, else where hack/controlplane.sh builds them.
func findAssets(ctx context.Context, dir, repoDir string) (string, error) {
	if dir == "" {
		dir = os.Getenv("KUBEBUILDER_ASSETS")
	}
	return controlplane.Binaries(ctx, dir, repoDir, "hack/controlplane.sh", "kube-apiserver", "etcd", "kubectl")
}

// newProcess prepares (does not start) a process in ns, logging to
// LogDir/<logName>.log.
func (c *Cluster) newProcess(name, logName string, ns *netlab.NetNS, path string, args ...string) *Process {
	return &Process{
		Name: name, NS: ns, Path: path, Args: args,
		Log: filepath.Join(c.LogDir, logName+".log"),
		Env: c.childEnv, Dir: c.RunDir,
	}
}

// startControlPlane starts etcd and kube-apiserver in the control-plane
// namespace (controlplane.Start) and takes its clients and kubeconfigs.
func (c *Cluster) startControlPlane(ctx context.Context) error {
	cp, err := controlplane.Start(ctx, controlplane.Spec{
		NS: c.ControlPlane, IP: APIServerIP, Port: APIServerPort, ServiceCIDR: ServiceCIDR,
		BinDir: c.AssetsDir, RunDir: c.RunDir, LogDir: c.LogDir, PKI: c.pki, Env: c.childEnv,
		ForwardAddr: c.opts.ForwardAddr,
	})
	c.cp, c.Etcd, c.APIServer = cp, cp.Etcd, cp.APIServer
	if err != nil {
		return err
	}
	c.APIServerURL, c.Config, c.Kube = cp.URL, cp.Config, cp.Kube
	c.Kubeconfig, c.NSKubeconfig, c.ForwardAddr = cp.Kubeconfig, cp.NSKubeconfig, cp.ForwardAddr
	c.Scheme = runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(c.Scheme); err != nil {
		return err
	}
	return v1alpha1.AddToScheme(c.Scheme)
}

// install applies config/crd, config/rbac and config/policy, renamed into
// ProxyshiftNamespace as config/default does, with `kubectl apply -k` run
// inside the control-plane namespace, and waits for the CRDs.
func (c *Cluster) install(ctx context.Context) error {
	dir := filepath.Join(c.RunDir, "install")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	// kustomize takes bases by relative path only.
	rel := func(sub string) (string, error) {
		abs, err := filepath.Abs(filepath.Join(c.opts.RepoDir, "config", sub))
		if err != nil {
			return "", err
		}
		return filepath.Rel(dir, abs)
	}
	crd, err := rel("crd")
	if err != nil {
		return err
	}
	rbac, err := rel("rbac")
	if err != nil {
		return err
	}
	policy, err := rel("policy")
	if err != nil {
		return err
	}
	kustomization := fmt.Sprintf(`# Written by the local cluster harness (test/cluster): proxyshift's CRDs,
# RBAC and admission policy from config/, in namespace %[1]s as
# config/default installs them.
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
namespace: %[1]s
resources:
- namespace.yaml
- %[2]s
- %[3]s
- %[4]s
`, ProxyshiftNamespace, crd, rbac, policy)
	namespace := fmt.Sprintf("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: %s\n", ProxyshiftNamespace)
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(kustomization), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "namespace.yaml"), []byte(namespace), 0o644); err != nil {
		return err
	}
	if err := c.cp.KubectlInNS(ctx, "apply", "-k", dir); err != nil {
		return err
	}
	if err := c.cp.KubectlInNS(ctx, "wait", "--for=condition=Established", "--timeout=60s",
		"crd/proxyconfigs.network.proxyshift.io", "crd/proxynodes.network.proxyshift.io"); err != nil {
		return err
	}
	c.Client, err = client.New(c.Config, client.Options{Scheme: c.Scheme})
	return err
}

// Kubectl runs the control plane's kubectl in the root namespace with
// Kubeconfig (through the loopback relay, as a user in another terminal
// would), in RepoDir, and returns its stdout; stderr is in the error.
func (c *Cluster) Kubectl(ctx context.Context, args ...string) (string, error) {
	return c.cp.Kubectl(ctx, c.opts.RepoDir, args...)
}

// writeCredentials asks the TokenRequest API for a token of the
// proxyshift-operator ServiceAccount and one per agent of the
// proxyshift-agent ServiceAccount, and writes a kubeconfig for each. RBAC
// is config/rbac's. Each agent's token is bound to a Pod object on its
// node, as the kubelet binds a DaemonSet pod's token (no kubelet runs the
// Pod: it is there for the binding), so the API server knows the node it
// speaks for and config/policy's admission policy lets it write that
// node's ProxyNode only.
func (c *Cluster) writeCredentials(ctx context.Context) error {
	token := func(sa string, bound *authenticationv1.BoundObjectReference) (string, error) {
		tr, err := c.Kube.CoreV1().ServiceAccounts(ProxyshiftNamespace).CreateToken(ctx, sa, &authenticationv1.TokenRequest{
			Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To(int64(tokenLifetime / time.Second)), BoundObjectRef: bound},
		}, metav1.CreateOptions{})
		if err != nil {
			return "", fmt.Errorf("token for ServiceAccount %s/%s: %w", ProxyshiftNamespace, sa, err)
		}
		return tr.Status.Token, nil
	}
	user := func(sa string) string { return "system:serviceaccount:" + ProxyshiftNamespace + ":" + sa }
	if !c.opts.NoOperator {
		tok, err := token("proxyshift-operator", nil)
		if err != nil {
			return err
		}
		if err := c.pki.WriteKubeconfig(filepath.Join(c.RunDir, "operator.kubeconfig"), c.APIServerURL,
			user("proxyshift-operator"), &clientcmdapi.AuthInfo{Token: tok}); err != nil {
			return err
		}
	}
	for _, n := range c.Nodes {
		pod, err := c.Kube.CoreV1().Pods(ProxyshiftNamespace).Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "proxyshift-agent-" + n.Name, Labels: map[string]string{"app.kubernetes.io/component": "agent"}},
			Spec: corev1.PodSpec{
				ServiceAccountName: "proxyshift-agent",
				NodeName:           n.Name,
				Containers:         []corev1.Container{{Name: "agent", Image: "proxyshift-agent"}},
			},
		}, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("agent pod for %s: %w", n.Name, err)
		}
		tok, err := token("proxyshift-agent", &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID})
		if err != nil {
			return err
		}
		n.Kubeconfig = filepath.Join(c.RunDir, "agent-"+n.Name+".kubeconfig")
		if err := c.pki.WriteKubeconfig(n.Kubeconfig, c.APIServerURL, user("proxyshift-agent"), &clientcmdapi.AuthInfo{Token: tok}); err != nil {
			return err
		}
	}
	return nil
}

// startProxyshift starts the operator (leader election on, in the
// control-plane namespace) and one agent per node, inside the node's
// namespace.
func (c *Cluster) startProxyshift() error {
	if !c.opts.NoOperator {
		args := append([]string{
			"--kubeconfig=" + filepath.Join(c.RunDir, "operator.kubeconfig"),
			"--leader-elect=true",
			"--leader-election-namespace=" + ProxyshiftNamespace,
			"--metrics-bind-address=" + operatorMetrics,
			"--health-probe-bind-address=" + operatorProbeAddr,
		}, c.opts.OperatorArgs...)
		c.Operator = c.newProcess("operator", "operator", c.ControlPlane, filepath.Join(c.BinDir, "proxyshift-operator"), args...)
		if err := c.Operator.Start(); err != nil {
			return err
		}
	}
	for _, n := range c.Nodes {
		n.HealthzAddr, n.MetricsAddr = agentHealthzAddr, agentMetricsAddr
		args := append([]string{
			"--kubeconfig=" + n.Kubeconfig,
			"--node-name=" + n.Name,
			"--mode=" + string(c.opts.Mode),
			"--cluster-cidr=" + ClusterCIDR.String(),
			"--metrics-bind-address=" + n.MetricsAddr,
			"--healthz-bind-address=" + n.HealthzAddr,
			// The agent runs inside the node's namespace already; naming it
			// also gives the agent a valid namespace handle (an agent whose
			// Options.NetNS is left at its zero value takes fd 0 for a
			// namespace and fails to list the node's addresses).
			"--netns=" + n.NS.Name,
		}, c.opts.AgentArgs...)
		n.Agent = c.newProcess("agent "+n.Name, "agent-"+n.Name, n.NS, filepath.Join(c.BinDir, "proxyshift-agent"), args...)
		if err := n.Agent.Start(); err != nil {
			return err
		}
	}
	return nil
}

// HTTPGet fetches http://addr/path from inside the node's namespace (the
// agent's endpoints listen on its loopback) and returns the status code
// and body.
func (n *Node) HTTPGet(ctx context.Context, addr, path string) (int, string, error) {
	return n.NS.HTTPGet(ctx, "http://"+addr+path)
}

// AgentHealthy asks the node's agent for /healthz.
func (n *Node) AgentHealthy(ctx context.Context) error {
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	code, body, err := n.HTTPGet(rctx, n.HealthzAddr, "/healthz")
	if err != nil {
		return err
	}
	if code != http.StatusOK {
		return fmt.Errorf("healthz %d: %s", code, strings.TrimSpace(body))
	}
	return nil
}

// WaitAgentHealthy waits up to timeout for the node's agent to answer
// /healthz with 200.
func (c *Cluster) WaitAgentHealthy(ctx context.Context, n *Node, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return controlplane.WaitFor(ctx, "agent "+n.Name+" healthy", time.Second/5, []*Process{n.Agent}, n.AgentHealthy)
}

func (c *Cluster) waitAgentsHealthy(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, readyBudget)
	defer cancel()
	for _, n := range c.Nodes {
		if err := controlplane.WaitFor(ctx, "agent "+n.Name+" healthy", time.Second/5, c.Processes(), n.AgentHealthy); err != nil {
			return err
		}
	}
	return nil
}

// waitServices waits until, from the first client, each demo Service's
// cluster IP answers, and the NodePort Service answers on every node.
func (c *Cluster) waitServices(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, readyBudget)
	defer cancel()
	client := c.ClientHost()
	for _, s := range c.Services {
		targets := []netip.AddrPort{s.ClusterAddr()}
		if s.NodePort != 0 {
			for _, n := range c.Nodes {
				targets = append(targets, s.NodePortAddr(n))
			}
		}
		for _, addr := range targets {
			err := controlplane.WaitFor(ctx, fmt.Sprintf("%s %s %s answers", s.Name, s.Protocol, addr), time.Second/5, c.Processes(), func(context.Context) error {
				_, err := client.NS.Request(s.Protocol, addr, time.Second)
				return err
			})
			if err != nil {
				return err
			}
		}
	}
	return nil
}
