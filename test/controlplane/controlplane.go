// Package controlplane runs the throwaway Kubernetes control plane of the
// local clusters (test/cluster, the namespace lab; test/realcluster, the
// real-node cluster): a certificate authority with the key pairs the
// components need (PKI), programs running inside network namespaces the
// harness created (Process), and etcd with kube-apiserver inside the
// control-plane namespace (Start), reached from the harness through a
// dialer that opens its sockets in that namespace and from kubectl in
// another terminal through a loopback relay. The two harnesses differ in
// what they run around it, not in how the control plane starts and stops.
package controlplane

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/proxyshift/proxyshift/test/netlab"
)

// etcd listens on the control-plane namespace's loopback only.
const (
	etcdClientURL = "http://127.0.0.1:2379"
	etcdPeerURL   = "http://127.0.0.1:2380"
	// readyBudget bounds the wait for a ready API server (machines busy
	// with other tests are slow; a healthy one needs a few seconds).
	readyBudget = 2 * time.Minute
	// stopGrace is how long kube-apiserver and etcd get to exit on
	// SIGTERM before SIGKILL (kube-apiserver may hang while etcd stops).
	stopGrace = 5 * time.Second
)

// Spec describes the control plane to start.
type Spec struct {
	// NS is the control-plane namespace; the API server serves on IP:Port
	// there (IP is NS's address on the clusters' fabric).
	NS   *netlab.NetNS
	IP   netip.Addr
	Port int
	// ServiceCIDR is the API server's service-cluster-ip-range; its first
	// address (the kubernetes Service) is in the serving certificate.
	ServiceCIDR netip.Prefix
	// BinDir holds kube-apiserver, etcd and kubectl.
	BinDir string
	// RunDir holds etcd's data and the kubeconfigs; LogDir the logs
	// (etcd.log, kube-apiserver.log, kubectl.log).
	RunDir, LogDir string
	// PKI is the cluster's certificate authority.
	PKI *PKI
	// Env is the processes' environment.
	Env []string
	// Authorization is the API server's --authorization-mode (default
	// RBAC).
	Authorization string
	// APIServerArgs are appended to the API server's flags (a later flag
	// overrides an earlier one).
	APIServerArgs []string
	// ForwardAddr is the root-namespace loopback address the relay to the
	// API server listens on ("127.0.0.1:0" for a free port).
	ForwardAddr string
}

// ControlPlane is a running etcd and kube-apiserver.
type ControlPlane struct {
	Etcd, APIServer *Process
	// URL is https://IP:Port, reachable from the clusters' namespaces only.
	URL string
	// Config is an administrator's client configuration whose connections
	// are opened inside the control-plane namespace; Kube uses it.
	Config *rest.Config
	Kube   kubernetes.Interface
	// Kubeconfig is an administrator's kubeconfig for the root namespace
	// (kubectl in another terminal), through the loopback relay at
	// ForwardAddr; NSKubeconfig is the same for programs inside the
	// clusters' namespaces (server URL).
	Kubeconfig, NSKubeconfig string
	ForwardAddr              string

	spec Spec
	fwd  *netlab.Forwarder
}

// Start starts etcd and kube-apiserver in spec.NS, writes the
// administrator's kubeconfigs, opens the loopback relay and waits until
// the API server is ready. It returns the control plane even on failure,
// for the caller to Stop.
func Start(ctx context.Context, spec Spec) (*ControlPlane, error) {
	cp := &ControlPlane{spec: spec, URL: "https://" + netip.AddrPortFrom(spec.IP, uint16(spec.Port)).String()}
	cp.Etcd = cp.NewProcess("etcd", "etcd", filepath.Join(spec.BinDir, "etcd"),
		"--name=localcluster",
		"--data-dir="+filepath.Join(spec.RunDir, "etcd"),
		"--listen-client-urls="+etcdClientURL,
		"--advertise-client-urls="+etcdClientURL,
		"--listen-peer-urls="+etcdPeerURL,
		"--initial-advertise-peer-urls="+etcdPeerURL,
		"--initial-cluster=localcluster="+etcdPeerURL,
		"--unsafe-no-fsync=true", // throwaway data: skip the disk flushes
		"--log-level=warn",
	)
	if err := cp.Etcd.Start(); err != nil {
		return cp, err
	}
	pki := spec.PKI
	err := pki.IssueServing("apiserver", "kube-apiserver",
		// The fabric address, 127.0.0.1 (the root-namespace relay and
		// loopback clients inside the control-plane namespace) and the
		// kubernetes Service's cluster IP.
		[]net.IP{spec.IP.AsSlice(), net.IPv4(127, 0, 0, 1), spec.ServiceCIDR.Addr().Next().AsSlice()},
		[]string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
			"kubernetes.default.svc.cluster.local"})
	if err != nil {
		return cp, err
	}
	if spec.Authorization == "" {
		spec.Authorization = "RBAC"
	}
	args := append([]string{
		"--etcd-servers=" + etcdClientURL,
		// All addresses of the control-plane namespace: its fabric address
		// and its own loopback, nothing else exists there.
		"--bind-address=0.0.0.0",
		"--secure-port=" + strconv.Itoa(spec.Port),
		"--advertise-address=" + spec.IP.String(),
		"--service-cluster-ip-range=" + spec.ServiceCIDR.String(),
		"--cert-dir=" + filepath.Join(spec.RunDir, "apiserver"),
		"--tls-cert-file=" + pki.Path("apiserver.crt"),
		"--tls-private-key-file=" + pki.Path("apiserver.key"),
		"--client-ca-file=" + pki.Path("ca.crt"),
		"--authorization-mode=" + spec.Authorization,
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + pki.Path("sa.pub"),
		"--service-account-signing-key-file=" + pki.Path("sa.key"),
		"--allow-privileged=true",
		"--profiling=false",
		"--v=1",
	}, spec.APIServerArgs...)
	cp.APIServer = cp.NewProcess("kube-apiserver", "kube-apiserver", filepath.Join(spec.BinDir, "kube-apiserver"), args...)
	if err := cp.APIServer.Start(); err != nil {
		return cp, err
	}

	cp.Config = &rest.Config{
		Host: cp.URL,
		TLSClientConfig: rest.TLSClientConfig{
			CAData: pki.CAPEM, CertData: pki.AdminCertPEM, KeyData: pki.AdminKeyPEM,
		},
		// Sockets open inside the control-plane namespace: the root
		// namespace needs no route to the lab.
		Dial:  spec.NS.DialContext,
		QPS:   200,
		Burst: 400,
	}
	if cp.Kube, err = kubernetes.NewForConfig(cp.Config); err != nil {
		return cp, err
	}
	admin := &clientcmdapi.AuthInfo{ClientCertificateData: pki.AdminCertPEM, ClientKeyData: pki.AdminKeyPEM}
	cp.NSKubeconfig = filepath.Join(spec.RunDir, "admin-in-namespaces.kubeconfig")
	if err := pki.WriteKubeconfig(cp.NSKubeconfig, cp.URL, AdminUser, admin); err != nil {
		return cp, err
	}
	l, err := net.Listen("tcp4", spec.ForwardAddr)
	if err != nil {
		return cp, fmt.Errorf("kubectl relay on %s: %w", spec.ForwardAddr, err)
	}
	cp.fwd = netlab.Forward(l, netip.AddrPortFrom(spec.IP, uint16(spec.Port)).String(), spec.NS.DialContext)
	cp.ForwardAddr = cp.fwd.Addr()
	cp.Kubeconfig = filepath.Join(spec.RunDir, "kubeconfig")
	if err := pki.WriteKubeconfig(cp.Kubeconfig, "https://"+cp.ForwardAddr, AdminUser, admin); err != nil {
		return cp, err
	}

	ctx, cancel := context.WithTimeout(ctx, readyBudget)
	defer cancel()
	return cp, WaitFor(ctx, "kube-apiserver /readyz", time.Second/4, []*Process{cp.Etcd, cp.APIServer}, func(ctx context.Context) error {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		body, err := cp.Kube.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(rctx)
		if err != nil {
			return fmt.Errorf("%w: %s", err, firstLine(string(body)))
		}
		return nil
	})
}

// NewProcess prepares (does not start) a process in the control-plane
// namespace, logging to LogDir/<logName>.log, with the control plane's
// environment and RunDir as its working directory.
func (cp *ControlPlane) NewProcess(name, logName, path string, args ...string) *Process {
	return &Process{
		Name: name, NS: cp.spec.NS, Path: path, Args: args,
		Log: filepath.Join(cp.spec.LogDir, logName+".log"),
		Env: cp.spec.Env, Dir: cp.spec.RunDir,
	}
}

// Stop closes the relay and stops kube-apiserver, then etcd, each with
// SIGTERM and a SIGKILL after a grace period. Stopping twice is harmless.
func (cp *ControlPlane) Stop() error {
	if cp.fwd != nil {
		cp.fwd.Close()
	}
	var errs []error
	for _, p := range []*Process{cp.APIServer, cp.Etcd} {
		if p != nil {
			errs = append(errs, p.Stop(stopGrace))
		}
	}
	return errors.Join(errs...)
}

// Kubectl runs kubectl in the root namespace with Kubeconfig (through the
// loopback relay, as a user in another terminal would), in dir, and
// returns its stdout; stderr is in the error.
func (cp *ControlPlane) Kubectl(ctx context.Context, dir string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(cp.spec.BinDir, "kubectl"), append([]string{"--kubeconfig", cp.Kubeconfig}, args...)...)
	cmd.Dir = dir
	cmd.Env = cp.spec.Env
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// KubectlInNS runs kubectl inside the control-plane namespace with
// NSKubeconfig, logging its command line and output to kubectl.log.
func (cp *ControlPlane) KubectlInNS(ctx context.Context, args ...string) error {
	f, err := os.OpenFile(filepath.Join(cp.spec.LogDir, "kubectl.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	full := append([]string{"netns", "exec", cp.spec.NS.Name, filepath.Join(cp.spec.BinDir, "kubectl"), "--kubeconfig", cp.NSKubeconfig}, args...)
	fmt.Fprintf(f, "==== %s: kubectl %s\n", time.Now().Format(time.RFC3339Nano), strings.Join(args, " "))
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, IPPath(), full...)
	cmd.Stdout = io.MultiWriter(f, &out)
	cmd.Stderr = cmd.Stdout
	cmd.Env = cp.spec.Env
	cmd.Dir = cp.spec.RunDir
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := spawn(cmd); err != nil {
		return err
	}
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(out.String()))
	}
	return nil
}

// Binaries returns the directory holding the named binaries: dir when
// given, else what repoDir's build script prints (which builds them once
// and caches them, e.g. hack/controlplane.sh). It fails naming the script
// when one is missing.
func Binaries(ctx context.Context, dir, repoDir, script string, names ...string) (string, error) {
	if dir == "" {
		cmd := exec.CommandContext(ctx, filepath.Join(repoDir, script))
		cmd.Dir = repoDir
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			return "", fmt.Errorf("%s: %w: %s", script, err, stderr.String())
		}
		dir = strings.TrimSpace(string(out))
	}
	for _, b := range names {
		if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
			return "", fmt.Errorf("binaries in %s: %w (build them with %s)", dir, err, script)
		}
	}
	return dir, nil
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(strings.TrimSpace(s), "\n")
	return s
}
