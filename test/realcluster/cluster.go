// Package realcluster runs a Kubernetes cluster of real nodes on one
// machine: the control plane (etcd, kube-apiserver, kube-controller-manager,
// kube-scheduler) in a network namespace, and N nodes, each a network
// namespace running a real containerd and a real kubelet v1.37.2 with
// bridge CNI, joined by a fabric bridge; then, as a kubeadm cluster has
// it, kube-proxy v1.37.2 as a DaemonSet in iptables mode, and a Deployment
// of backend pods behind a ClusterIP and a NodePort Service, whose
// EndpointSlices the real EndpointSlice controller writes.
//
// It is the world for every claim about running proxyshift the way users
// run it (images, kustomize install, pod security, authorization, taking
// over from kube-proxy); the namespace lab (test/cluster) is the fast world
// for the switch protocol and the dataplanes, with agents as processes and
// EndpointSlices written by the test.
//
// Everything lives in namespaces the harness creates, with addresses from
// 198.18.0.0/15 (the namespace lab's address plan, see test/cluster); the
// root namespace gets no interface, route, rule or sysctl. Each node's
// containerd and kubelet run in a mount and PID namespace of the node's
// own (see Node), in a cgroup of their own. Close kills every node at once
// (SIGKILL to the init of its PID namespace), removes its cgroups, stops
// the control plane and removes every namespace and file; Leftovers checks
// that nothing remains. Processes also die with the harness (Pdeathsig,
// unshare --kill-child), and a later Start removes namespaces and cgroups
// a killed harness left behind.
//
// Start needs root. The binaries come from hack/realcluster.sh (built
// from their Go modules once, cached under ~/.cache/proxyshift), the
// images are built with hack/images in each run. From a test:
//
//	c, err := realcluster.Start(ctx, realcluster.Options{Logf: t.Logf})
//	if err != nil { t.Fatal(err) }
//	t.Cleanup(func() { _ = c.Close() })
package realcluster

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/proxyshift/proxyshift/nodeagent/nsexec"
	"github.com/proxyshift/proxyshift/test/cluster"
	"github.com/proxyshift/proxyshift/test/controlplane"
	"github.com/proxyshift/proxyshift/test/harness"
	"github.com/proxyshift/proxyshift/test/netlab"
)

// Options configure a cluster. The zero value is a usable default.
type Options struct {
	// Nodes is the number of nodes (default 3, at most cluster.MaxNodes).
	Nodes int
	// NoKubeProxy leaves kube-proxy out: nothing serves the Services until
	// another proxy does.
	NoKubeProxy bool
	// NoWorkload leaves the Deployment and its Services out.
	NoWorkload bool
	// RunDir holds certificates, kubeconfigs, etcd's data, the nodes'
	// directories and logs. Default: a new temporary directory, removed by
	// Close unless KeepRunDir (a given RunDir is never removed).
	RunDir     string
	KeepRunDir bool
	// BinDir holds the binaries hack/realcluster.sh builds (default: what
	// it prints, building them the first time).
	BinDir string
	// RepoDir is the proxyshift source tree (default: the tree this
	// package was compiled from).
	RepoDir string
	// ForwardAddr is the root-namespace loopback address kubectl reaches
	// the API server on (default 127.0.0.1:0, a free port).
	ForwardAddr string
	// StartTimeout bounds Start as a whole (default 30m: a cold build of
	// the binaries is part of it).
	StartTimeout time.Duration
	// Logf receives progress lines (default: none).
	Logf func(format string, args ...any)
}

// Cluster is a running real-node cluster. Its fields are set by Start and
// must not be changed.
type Cluster struct {
	// RunDir holds everything the cluster writes; LogDir one log per
	// process (etcd.log, kube-apiserver.log, node-1-kubelet.log, ...).
	RunDir, LogDir string
	// Kubeconfig is an administrator's kubeconfig for the root namespace
	// (kubectl in another terminal), through the loopback relay at
	// ForwardAddr; NSKubeconfig is the same for programs inside the
	// cluster's namespaces (server APIServerURL).
	Kubeconfig, NSKubeconfig, ForwardAddr string
	// APIServerURL is https://198.18.0.2:6443, reachable from the
	// cluster's namespaces only.
	APIServerURL string
	// Config is an administrator's client configuration whose connections
	// open inside the control-plane namespace; Kube uses it.
	Config *rest.Config
	Kube   kubernetes.Interface
	// Fabric joins the control plane, the nodes and the client;
	// ControlPlane runs etcd, kube-apiserver, kube-controller-manager and
	// kube-scheduler.
	Fabric, ControlPlane *netlab.NetNS
	// Nodes are the nodes in order (node-1, node-2, ...).
	Nodes []*Node
	// Client is a host on the fabric outside the cluster, with its default
	// route via node-1: where outside traffic comes from.
	Client *netlab.NetNS
	// ClientIP is the client's fabric address.
	ClientIP netip.Addr
	// Etcd, APIServer, ControllerManager and Scheduler are the control
	// plane's processes.
	Etcd, APIServer, ControllerManager, Scheduler *controlplane.Process
	// BinDir holds the binaries; Images the image archives every node
	// imported at start.
	BinDir string
	Images []string
	// Timings are the durations of Start's steps, in order; Pods how long
	// each pod the harness created (kube-proxy's, the Deployment's) took
	// from its creation to Running.
	Timings []harness.Timing
	Pods    []harness.Timing

	opts       Options
	pki        *controlplane.PKI
	cp         *controlplane.ControlPlane
	fabric     *netlab.Fabric
	run        *harness.RunDir
	childEnv   []string
	pauseBin   string
	namespaces *netlab.Namespaces

	closeOnce sync.Once
	closeErr  error
}

// nsPrefix starts the names of the namespaces the harness creates
// ("psr-<pid>-<run>-<role>", see netlab.Namespaces); the nodes' cgroups
// take the same form.
const nsPrefix = cgroupPrefix

// Budgets for the waits (a busy machine is slow; a healthy one needs a
// few seconds for each).
const (
	readyBudget    = 3 * time.Minute
	servicesBudget = 2 * time.Minute
)

// binaries are the programs Start needs from BinDir.
var binaries = []string{
	"etcd", "kube-apiserver", "kubectl", "kube-controller-manager", "kube-scheduler",
	"kubelet", "kube-proxy", "containerd", "containerd-shim-runc-v2", "ctr",
}

func (o *Options) defaults() error {
	if o.Nodes == 0 {
		o.Nodes = 3
	}
	if o.Nodes < 1 || o.Nodes > cluster.MaxNodes {
		return fmt.Errorf("Nodes = %d: must be 1..%d", o.Nodes, cluster.MaxNodes)
	}
	if o.ForwardAddr == "" {
		o.ForwardAddr = "127.0.0.1:0"
	}
	if ap, err := netip.ParseAddrPort(o.ForwardAddr); err != nil || !ap.Addr().IsLoopback() {
		return fmt.Errorf("ForwardAddr %q: must be a loopback address and port", o.ForwardAddr)
	}
	if o.StartTimeout == 0 {
		o.StartTimeout = 30 * time.Minute
	}
	if o.RepoDir == "" {
		o.RepoDir = cluster.RepoRoot()
	}
	if o.Logf == nil {
		o.Logf = harness.Quiet
	}
	return nil
}

// CanRun says why this machine cannot run kubelets (nil when it can): it
// needs root and cgroup hierarchies. (Missing binaries are built, and
// missing Debian packages are an error of Start naming
// hack/install-deps.sh, not a reason to skip.)
func CanRun() error {
	if os.Geteuid() != 0 {
		return errors.New("the real-node cluster needs root (network, mount and PID namespaces, cgroups)")
	}
	if m, err := cgroupMounts(); err != nil || len(m) == 0 {
		return fmt.Errorf("no cgroup hierarchy mounted (%v)", err)
	}
	return nil
}

// checkTools fails naming the first missing program of the Debian
// packages hack/install-deps.sh installs: runc, the CNI plugins,
// util-linux's unshare, nsenter and mount.
func checkTools() error {
	for _, b := range []string{"runc", "unshare", "nsenter", "mount", filepath.Join(cniBinDir, "bridge"), filepath.Join(cniBinDir, "host-local"), filepath.Join(cniBinDir, "loopback")} {
		if _, err := nsexec.LookPath(b); err != nil {
			return fmt.Errorf("%s is missing (run hack/install-deps.sh): %w", b, err)
		}
	}
	return nil
}

// Start brings a cluster up and returns once every node is Ready, every
// kube-proxy and Deployment pod runs, and the Services answer from every
// node and from the client. On failure (and when ctx ends) it tears down
// what it built and returns the error, naming the failed step and quoting
// the log of a process that exited. The caller must Close the cluster.
func Start(ctx context.Context, opts Options) (*Cluster, error) {
	if err := CanRun(); err != nil {
		return nil, err
	}
	if err := checkTools(); err != nil {
		return nil, err
	}
	if err := opts.defaults(); err != nil {
		return nil, err
	}
	c := &Cluster{opts: opts, namespaces: netlab.NewNamespaces(nsPrefix)}
	ctx, cancel := context.WithTimeout(ctx, opts.StartTimeout)
	defer cancel()
	if err := c.start(ctx); err != nil {
		if cerr := c.Close(); cerr != nil {
			err = fmt.Errorf("%w (and tearing down: %v)", err, cerr)
		}
		return nil, err
	}
	return c, nil
}

func (c *Cluster) logf(format string, args ...any) { c.opts.Logf(format, args...) }

// step runs one step of Start and records its duration.
func (c *Cluster) step(name string, fn func() error) error {
	return harness.Step(&c.Timings, c.opts.Logf, name, fn)
}

func (c *Cluster) start(ctx context.Context) error {
	o := &c.opts
	begin := time.Now()
	netlab.SweepStale(nsPrefix, c.logf)
	sweepStaleCgroups(c.logf)

	if err := c.step("run directory", func() (err error) {
		if c.run, err = harness.NewRunDir(o.RunDir, "proxyshift-realcluster-"); err != nil {
			return err
		}
		c.RunDir, c.LogDir = c.run.Dir, c.run.LogDir
		return nil
	}); err != nil {
		return err
	}
	c.logf("run directory %s", c.RunDir)
	if err := c.step("binaries (hack/realcluster.sh)", func() (err error) {
		if c.BinDir, err = controlplane.Binaries(ctx, o.BinDir, o.RepoDir, "hack/realcluster.sh", binaries...); err != nil {
			return err
		}
		// The processes get a minimal environment with HOME in the run
		// directory, so nothing (kubectl's cache, say) lands in the real
		// one; containerd finds its shim in BinDir through PATH.
		c.childEnv = append(c.run.Env, "PATH="+strings.Join([]string{c.BinDir, "/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"}, ":"))
		return nil
	}); err != nil {
		return err
	}
	// The images build (the first time: Debian packages for kube-proxy's)
	// while the network and the control plane come up.
	imagesDone := make(chan error, 1)
	go func() { imagesDone <- c.buildImages(ctx) }()
	imagesWaited := false
	defer func() {
		if !imagesWaited {
			<-imagesDone
		}
	}()

	if err := c.step("certificates", func() (err error) {
		c.pki, err = controlplane.NewPKI(filepath.Join(c.RunDir, "pki"))
		return err
	}); err != nil {
		return err
	}
	if err := c.step("network namespaces", c.buildNetwork); err != nil {
		return err
	}
	if err := c.step("control plane ready", func() error { return c.startControlPlane(ctx) }); err != nil {
		return err
	}
	if err := c.step("images (hack/images)", func() error {
		imagesWaited = true
		return <-imagesDone
	}); err != nil {
		return err
	}
	if err := c.step("nodes Ready", func() error { return c.startNodes(ctx) }); err != nil {
		return err
	}
	for _, n := range c.Nodes {
		harness.Record(&c.Timings, c.opts.Logf, n.Name+" Ready", n.ReadyAfter)
	}
	if err := c.step("workloads Running", func() error { return c.applyWorkloads(ctx) }); err != nil {
		return err
	}
	if !o.NoKubeProxy && !o.NoWorkload {
		if err := c.step("Services answer", func() error { return c.waitServices(ctx) }); err != nil {
			return err
		}
	}
	harness.Record(&c.Timings, c.opts.Logf, "bring-up", time.Since(begin))
	return nil
}

// newProcess prepares (does not start) a process in ns, logging to
// LogDir/<logName>.log.
func (c *Cluster) newProcess(name, logName string, ns *netlab.NetNS, path string, args ...string) *controlplane.Process {
	return &controlplane.Process{
		Name: name, NS: ns, Path: path, Args: args,
		Log: filepath.Join(c.LogDir, logName+".log"),
		Env: c.childEnv, Dir: c.RunDir,
	}
}

// Processes lists the cluster's processes: the control plane's, then each
// node's.
func (c *Cluster) Processes() []*controlplane.Process {
	var ps []*controlplane.Process
	for _, p := range []*controlplane.Process{c.Etcd, c.APIServer, c.ControllerManager, c.Scheduler} {
		if p != nil {
			ps = append(ps, p)
		}
	}
	for _, n := range c.Nodes {
		ps = append(ps, n.Processes()...)
	}
	return ps
}

// Node returns the node called name, or nil.
func (c *Cluster) Node(name string) *Node {
	for _, n := range c.Nodes {
		if n.Name == name {
			return n
		}
	}
	return nil
}

// Kubectl runs kubectl in the root namespace with Kubeconfig (as a user in
// another terminal would), in RepoDir, and returns its stdout; stderr is
// in the error. `Kubectl(ctx, "apply", "-k", "config/local")` installs
// proxyshift as its README tells a user.
func (c *Cluster) Kubectl(ctx context.Context, args ...string) (string, error) {
	return c.cp.Kubectl(ctx, c.opts.RepoDir, args...)
}

// ImportImage imports an OCI image archive into every node's containerd.
func (c *Cluster) ImportImage(ctx context.Context, archive string) error {
	var errs []error
	for _, n := range c.Nodes {
		errs = append(errs, n.ImportImage(ctx, archive))
	}
	return errors.Join(errs...)
}

// Close tears the cluster down: every node (SIGKILL to the init of its PID
// namespace, which ends its kubelet, containerd, shims and containers, and
// its mount namespace with every mount made inside), the nodes' cgroups,
// kube-scheduler and kube-controller-manager, kube-apiserver and etcd
// (SIGTERM, then SIGKILL), every namespace, and the run directory (unless
// kept or given). It goes on past errors and returns them all; later calls
// return the same.
func (c *Cluster) Close() error {
	c.closeOnce.Do(func() { c.closeErr = c.close() })
	return c.closeErr
}

func (c *Cluster) close() error {
	var (
		errs []error
		mu   sync.Mutex
		wg   sync.WaitGroup
	)
	add := func(err error) {
		if err != nil {
			mu.Lock()
			errs = append(errs, err)
			mu.Unlock()
		}
	}
	for _, n := range c.Nodes {
		wg.Go(func() { add(n.stop()) })
	}
	wg.Wait()
	for _, p := range []*controlplane.Process{c.Scheduler, c.ControllerManager} {
		if p != nil {
			wg.Go(func() { add(p.Stop(5 * time.Second)) })
		}
	}
	wg.Wait()
	if c.cp != nil {
		add(c.cp.Stop())
	}
	add(unmountUnder(c.RunDir))
	add(c.namespaces.DeleteAll())
	add(c.run.Remove(c.opts.KeepRunDir))
	return errors.Join(errs...)
}

// Summary describes the running cluster for a person: how to reach it,
// its nodes, and where the logs are.
func (c *Cluster) Summary() string {
	var b strings.Builder
	fmt.Fprintf(&b, "kubeconfig:  %s\n", c.Kubeconfig)
	fmt.Fprintf(&b, "             export KUBECONFIG=%s; kubectl get nodes -o wide; kubectl get pods -A -o wide\n", c.Kubeconfig)
	fmt.Fprintf(&b, "kubectl:     %s (v1.37.2; any recent one works)\n", filepath.Join(c.BinDir, "kubectl"))
	fmt.Fprintf(&b, "api server:  %s inside the cluster, https://%s from this machine (loopback relay)\n", c.APIServerURL, c.ForwardAddr)
	fmt.Fprintf(&b, "run dir:     %s\nlogs:        %s\n", c.RunDir, c.LogDir)
	fmt.Fprintf(&b, "nodes:\n")
	for _, n := range c.Nodes {
		fmt.Fprintf(&b, "  %-8s %-12s pods %-16s netns %-24s shell: nsenter -t %d -m -n -p\n", n.Name, n.IP, n.PodCIDR, n.NS.Name, n.init)
	}
	fmt.Fprintf(&b, "client:      %s (netns %s, default route via node-1)\n", c.ClientIP, c.Client.Name)
	if !c.opts.NoWorkload {
		fmt.Fprintf(&b, "workload:    Deployment %[1]s/web, Services %[1]s/web (ClusterIP, port 80) and %[1]s/web-nodeport (NodePort %[2]d)\n", WorkloadNamespace, WebNodePort)
		fmt.Fprintf(&b, "try:         ip netns exec %s bash -c 'exec 3<>/dev/tcp/%s/%d; head -1 <&3'\n", c.Client.Name, c.Nodes[0].IP, WebNodePort)
	}
	return b.String()
}
