package cluster

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
	"github.com/proxyshift/proxyshift/test/netlab"
)

// The agents' and the operator's endpoints, on their namespace's loopback.
const (
	agentHealthzAddr  = "127.0.0.1:10256"
	agentMetricsAddr  = "127.0.0.1:10249"
	operatorMetrics   = "127.0.0.1:8080"
	operatorProbeAddr = "127.0.0.1:8081"
	etcdClientURL     = "http://127.0.0.1:2379"
	etcdPeerURL       = "http://127.0.0.1:2380"
	// apiServerBudget bounds the wait for a ready API server, readyBudget
	// the waits for healthy agents and for answering Services (machines
	// busy with other tests are slow; a healthy one needs a few seconds).
	apiServerBudget = 2 * time.Minute
	readyBudget     = 90 * time.Second
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

// findAssets locates kube-apiserver, etcd and kubectl.
func findAssets(ctx context.Context, dir, repoDir string) (string, error) {
	if dir == "" {
		dir = os.Getenv("KUBEBUILDER_ASSETS")
	}
	if dir == "" {
		cmd := exec.CommandContext(ctx, filepath.Join(repoDir, "hack", "controlplane.sh"))
		cmd.Dir = repoDir
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			return "", fmt.Errorf("hack/controlplane.sh: %w: %s", err, stderr.String())
		}
		dir = strings.TrimSpace(string(out))
	}
	for _, b := range []string{"kube-apiserver", "etcd", "kubectl"} {
		if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
			return "", fmt.Errorf("control plane binaries in %s: %w (build them with hack/controlplane.sh)", dir, err)
		}
	}
	return dir, nil
}

// serveIPs are the API server certificate's IP SANs.
func serveIPs() []net.IP {
	return []net.IP{APIServerIP.AsSlice(), net.IPv4(127, 0, 0, 1), ServiceCIDR.Addr().Next().AsSlice()}
}

// newProcess prepares (does not start) a process in ns, logging to
// LogDir/<logName>.log.
func (c *Cluster) newProcess(name, logName string, ns *netlab.NetNS, path string, args ...string) *Process {
	return &Process{
		Name: name, NS: ns, Path: path, Args: args,
		Log: filepath.Join(c.LogDir, logName+".log"),
		env: c.childEnv, dir: c.RunDir,
	}
}

// startControlPlane starts etcd and kube-apiserver in the control-plane
// namespace, builds the administrator's clients and kubeconfigs and the
// loopback forwarder, and waits until the API server is ready.
func (c *Cluster) startControlPlane(ctx context.Context) error {
	c.Etcd = c.newProcess("etcd", "etcd", c.ControlPlane, filepath.Join(c.AssetsDir, "etcd"),
		"--name=localcluster",
		"--data-dir="+filepath.Join(c.RunDir, "etcd"),
		"--listen-client-urls="+etcdClientURL,
		"--advertise-client-urls="+etcdClientURL,
		"--listen-peer-urls="+etcdPeerURL,
		"--initial-advertise-peer-urls="+etcdPeerURL,
		"--initial-cluster=localcluster="+etcdPeerURL,
		"--unsafe-no-fsync=true", // throwaway data: skip the disk flushes
		"--log-level=warn",
	)
	if err := c.Etcd.Start(); err != nil {
		return err
	}
	p := c.pki.path
	c.APIServerURL = fmt.Sprintf("https://%s", netip.AddrPortFrom(APIServerIP, APIServerPort))
	c.APIServer = c.newProcess("kube-apiserver", "kube-apiserver", c.ControlPlane, filepath.Join(c.AssetsDir, "kube-apiserver"),
		"--etcd-servers="+etcdClientURL,
		// All addresses of the control-plane namespace: its fabric address
		// and its own loopback, nothing else exists there.
		"--bind-address=0.0.0.0",
		"--secure-port="+strconv.Itoa(APIServerPort),
		"--advertise-address="+APIServerIP.String(),
		"--service-cluster-ip-range="+ServiceCIDR.String(),
		"--cert-dir="+filepath.Join(c.RunDir, "apiserver"),
		"--tls-cert-file="+p("apiserver.crt"),
		"--tls-private-key-file="+p("apiserver.key"),
		"--client-ca-file="+p("ca.crt"),
		"--authorization-mode=RBAC",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file="+p("sa.pub"),
		"--service-account-signing-key-file="+p("sa.key"),
		"--allow-privileged=true",
		"--profiling=false",
		"--v=1",
	)
	if err := c.APIServer.Start(); err != nil {
		return err
	}

	c.Config = &rest.Config{
		Host: c.APIServerURL,
		TLSClientConfig: rest.TLSClientConfig{
			CAData: c.pki.caPEM, CertData: c.pki.adminCertPEM, KeyData: c.pki.adminKeyPEM,
		},
		// Sockets open inside the control-plane namespace: the root
		// namespace needs no route to the lab.
		Dial:  c.ControlPlane.DialContext,
		QPS:   200,
		Burst: 400,
	}
	var err error
	if c.Kube, err = kubernetes.NewForConfig(c.Config); err != nil {
		return err
	}
	c.Scheme = runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(c.Scheme); err != nil {
		return err
	}
	if err := v1alpha1.AddToScheme(c.Scheme); err != nil {
		return err
	}

	admin := &clientcmdapi.AuthInfo{ClientCertificateData: c.pki.adminCertPEM, ClientKeyData: c.pki.adminKeyPEM}
	c.NSKubeconfig = filepath.Join(c.RunDir, "admin-in-namespaces.kubeconfig")
	if err := c.writeKubeconfig(c.NSKubeconfig, c.APIServerURL, adminUser, admin); err != nil {
		return err
	}
	l, err := net.Listen("tcp4", c.opts.ForwardAddr)
	if err != nil {
		return fmt.Errorf("kubectl forwarder on %s: %w", c.opts.ForwardAddr, err)
	}
	c.fwd = netlab.Forward(l, netip.AddrPortFrom(APIServerIP, APIServerPort).String(), c.ControlPlane.DialContext)
	c.ForwardAddr = c.fwd.Addr()
	c.Kubeconfig = filepath.Join(c.RunDir, "kubeconfig")
	if err := c.writeKubeconfig(c.Kubeconfig, "https://"+c.ForwardAddr, adminUser, admin); err != nil {
		return err
	}

	ctx, cancel := context.WithTimeout(ctx, apiServerBudget)
	defer cancel()
	return c.waitFor(ctx, "kube-apiserver /readyz", time.Second/4, c.Processes(), func(ctx context.Context) error {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		body, err := c.Kube.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(rctx)
		if err != nil {
			return fmt.Errorf("%w: %s", err, firstLine(string(body)))
		}
		return nil
	})
}

// writeKubeconfig writes a kubeconfig for server, trusting the cluster's CA.
func (c *Cluster) writeKubeconfig(path, server, user string, auth *clientcmdapi.AuthInfo) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["proxyshift-local"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: c.pki.caPEM}
	cfg.AuthInfos[user] = auth
	cfg.Contexts["proxyshift-local"] = &clientcmdapi.Context{Cluster: "proxyshift-local", AuthInfo: user}
	cfg.CurrentContext = "proxyshift-local"
	return clientcmd.WriteToFile(*cfg, path)
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
	if err := c.kubectlInNS(ctx, "apply", "-k", dir); err != nil {
		return err
	}
	if err := c.kubectlInNS(ctx, "wait", "--for=condition=Established", "--timeout=60s",
		"crd/proxyconfigs.network.proxyshift.io", "crd/proxynodes.network.proxyshift.io"); err != nil {
		return err
	}
	c.Client, err = client.New(c.Config, client.Options{Scheme: c.Scheme})
	return err
}

// kubectlInNS runs kubectl inside the control-plane namespace with the
// administrator's in-namespace kubeconfig, logging to kubectl.log.
func (c *Cluster) kubectlInNS(ctx context.Context, args ...string) error {
	log := filepath.Join(c.LogDir, "kubectl.log")
	f, err := os.OpenFile(log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	full := append([]string{"netns", "exec", c.ControlPlane.Name, filepath.Join(c.AssetsDir, "kubectl"), "--kubeconfig", c.NSKubeconfig}, args...)
	fmt.Fprintf(f, "==== %s: kubectl %s\n", time.Now().Format(time.RFC3339Nano), strings.Join(args, " "))
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, ipPath(), full...)
	cmd.Stdout = io.MultiWriter(f, &out)
	cmd.Stderr = cmd.Stdout
	cmd.Env = c.childEnv
	cmd.Dir = c.RunDir
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := spawn(cmd); err != nil {
		return err
	}
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(out.String()))
	}
	return nil
}

// Kubectl runs the control plane's kubectl in the root namespace with
// Kubeconfig (through the loopback forwarder, as a user in another
// terminal would) and returns its stdout; stderr is in the error.
func (c *Cluster) Kubectl(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(c.AssetsDir, "kubectl"), append([]string{"--kubeconfig", c.Kubeconfig}, args...)...)
	cmd.Dir = c.opts.RepoDir
	cmd.Env = c.childEnv
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
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
		if err := c.writeKubeconfig(filepath.Join(c.RunDir, "operator.kubeconfig"), c.APIServerURL,
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
		if err := c.writeKubeconfig(n.Kubeconfig, c.APIServerURL, user("proxyshift-agent"), &clientcmdapi.AuthInfo{Token: tok}); err != nil {
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
	return httpGetIn(ctx, n.NS, addr, path)
}

func httpGetIn(ctx context.Context, ns *netlab.NetNS, addr, path string) (int, string, error) {
	hc := &http.Client{Transport: &http.Transport{DialContext: ns.DialContext, DisableKeepAlives: true}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+path, nil)
	if err != nil {
		return 0, "", err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, string(b), err
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
	return c.waitFor(ctx, "agent "+n.Name+" healthy", time.Second/5, []*Process{n.Agent}, n.AgentHealthy)
}

func (c *Cluster) waitAgentsHealthy(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, readyBudget)
	defer cancel()
	for _, n := range c.Nodes {
		if err := c.waitFor(ctx, "agent "+n.Name+" healthy", time.Second/5, c.Processes(), n.AgentHealthy); err != nil {
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
			err := c.waitFor(ctx, fmt.Sprintf("%s %s %s answers", s.Name, s.Protocol, addr), time.Second/5, c.Processes(), func(context.Context) error {
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

// waitFor polls check every interval until it succeeds, ctx ends, or a
// process of procs exits (then the error quotes its log's end).
func (c *Cluster) waitFor(ctx context.Context, what string, interval time.Duration, procs []*Process, check func(context.Context) error) error {
	var last error
	for {
		if last = check(ctx); last == nil {
			return nil
		}
		for _, p := range procs {
			if done, exitErr := p.Exited(); isClosedRO(done) {
				return fmt.Errorf("%s: %s exited (%v); end of %s:\n%s", what, p.Name, exitText(exitErr()), p.Log, lastRunLog(p.Log))
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: %w; last error: %v", what, ctx.Err(), last)
		case <-time.After(interval):
		}
	}
}

func isClosedRO(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(strings.TrimSpace(s), "\n")
	return s
}
