// Package cluster runs a whole proxyshift cluster on one machine, for the
// end-to-end tests, the demo and benchmarks: the test control plane (etcd
// and kube-apiserver) in a control-plane network namespace, proxyshift
// installed from config/ with `kubectl apply -k`, the operator as a
// process, and N "nodes" (network namespaces with a Node object, a pod
// bridge, backend "pods" answering with their names, and their own
// proxyshift-agent process), joined by a fabric bridge, plus a client
// namespace outside the cluster to send traffic from.
//
// Everything lives in namespaces the harness creates, with addresses from
// 198.18.0.0/15 (see the address plan in topology.go); the root namespace
// gets no interface, route or rule. The harness itself talks to the API
// server through a dialer that opens its sockets inside the control-plane
// namespace, and relays 127.0.0.1:<port> to it so kubectl can be used from
// another terminal. Close stops every process and removes every namespace
// and file; processes also die with the harness (Pdeathsig), and a later
// Start removes namespaces a killed harness left behind.
//
// Start needs root. From a test:
//
//	c, err := cluster.Start(ctx, cluster.Options{Logf: t.Logf})
//	if err != nil { t.Fatal(err) }
//	t.Cleanup(func() { _ = c.Close() })
package cluster

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
	"github.com/proxyshift/proxyshift/test/controlplane"
	"github.com/proxyshift/proxyshift/test/harness"
	"github.com/proxyshift/proxyshift/test/netlab"
)

// Options configure a cluster. The zero value is a usable default.
type Options struct {
	// Nodes is the number of nodes (default 3, at most MaxNodes).
	Nodes int
	// PodsPerNode is the number of backend pods on each node (default 2).
	PodsPerNode int
	// Mode is the dataplane the agents start with, passed as --mode and
	// written as the ProxyNodes' spec.desiredMode (default nftables).
	Mode v1alpha1.ProxyMode
	// AgentArgs and OperatorArgs are appended to the flags the harness
	// passes (a later flag overrides an earlier one).
	AgentArgs, OperatorArgs []string
	// NoOperator leaves the operator out.
	NoOperator bool
	// NoProxyNodes leaves creating the ProxyNodes to the operator (by
	// default the harness creates one per node, desiredMode Mode, owned by
	// its Node, so agents that follow their ProxyNode start right away).
	NoProxyNodes bool
	// NoServices leaves out the demo Services and their EndpointSlices
	// (the pods still run); for benchmarks that bring their own.
	NoServices bool
	// RunDir holds certificates, kubeconfigs, etcd's data, binaries and
	// logs. Default: a new temporary directory, removed by Close unless
	// KeepRunDir (a given RunDir is never removed).
	RunDir     string
	KeepRunDir bool
	// BinDir holds proxyshift-operator and proxyshift-agent. Default: build
	// them from RepoDir into RunDir/bin (see Build).
	BinDir string
	// AssetsDir holds kube-apiserver, etcd and kubectl. Default:
	// $KUBEBUILDER_ASSETS, else what hack/controlplane.sh prints.
	AssetsDir string
	// RepoDir is the proxyshift source tree (config/, cmd/). Default: the
	// tree this package was compiled from.
	RepoDir string
	// ForwardAddr is the root-namespace loopback address kubectl reaches
	// the API server on (default 127.0.0.1:0, a free port).
	ForwardAddr string
	// StartTimeout bounds Start as a whole, building included (default
	// 10m, for a build with a cold cache; the waits for the API server,
	// the agents and the Services have their own bounds of 2m, 90s, 90s).
	StartTimeout time.Duration
	// Logf receives progress lines (default: none).
	Logf func(format string, args ...any)
}

// Cluster is a running local cluster. Its fields are set by Start and
// must not be changed.
type Cluster struct {
	// RunDir holds everything the cluster writes (see Options.RunDir).
	RunDir string
	// LogDir holds one log file per process (etcd.log, kube-apiserver.log,
	// operator.log, agent-node-1.log, ...) under RunDir.
	LogDir string
	// Kubeconfig is an administrator's kubeconfig for use from the root
	// namespace (kubectl in another terminal): it reaches the API server
	// through the harness's loopback forwarder at ForwardAddr.
	Kubeconfig  string
	ForwardAddr string
	// NSKubeconfig is the same administrator's kubeconfig for programs
	// running inside the lab's namespaces (server APIServerURL).
	NSKubeconfig string
	// APIServerURL is https://198.18.0.2:6443, reachable from the lab's
	// namespaces only.
	APIServerURL string
	// Config is an administrator's client configuration whose connections
	// are opened inside the control-plane namespace; Kube and Client use it.
	Config *rest.Config
	Kube   kubernetes.Interface
	Client client.Client
	Scheme *runtime.Scheme
	// Fabric holds the bridge joining the control plane, the nodes and the
	// clients; ControlPlane runs etcd, kube-apiserver and the operator.
	Fabric, ControlPlane *netlab.NetNS
	// Nodes are the nodes in order (node-1, node-2, ...).
	Nodes []*Node
	// Pods are all pods, node by node.
	Pods []*Pod
	// Clients are hosts outside the cluster; Clients[0] ("client") routes
	// through node-1.
	Clients []*Host
	// Services are the demo Services (see ServiceNames), with their
	// cluster IPs and node ports as the API server assigned them.
	Services []*Service
	// Etcd, APIServer and Operator are the control plane's processes
	// (Operator is nil with NoOperator).
	Etcd, APIServer, Operator *Process
	// BinDir and AssetsDir are where the binaries came from.
	BinDir, AssetsDir string
	// Timings are the durations of Start's steps, in order.
	Timings []Timing

	opts       Options
	pki        *controlplane.PKI
	cp         *controlplane.ControlPlane
	fabric     *netlab.Fabric
	run        *harness.RunDir
	childEnv   []string
	namespaces *netlab.Namespaces

	mu        sync.Mutex
	closeOnce sync.Once
	closeErr  error
}

// Timing is how long one step of Start took.
type Timing = harness.Timing

// Node is one node: a namespace with its fabric address, its pod bridge
// and pods, a Node object, and its agent process.
type Node struct {
	// Name is the Node object's name ("node-1") and Index its number (1-based).
	Name  string
	Index int
	NS    *netlab.NetNS
	// IP is the node's fabric address, its Node's InternalIP and where its
	// NodePorts answer.
	IP netip.Addr
	// PodCIDR is the node's pod subnet; PodGateway, its first address, is
	// held by the node's pod bridge.
	PodCIDR    netip.Prefix
	PodGateway netip.Addr
	// Pods are the node's pods.
	Pods []*Pod
	// Agent is the node's proxyshift-agent, running inside NS with its own
	// ServiceAccount token (Kubeconfig). Use Agent.Kill (kill -9),
	// Agent.Stop, Agent.Start and Agent.Restart.
	Agent      *Process
	Kubeconfig string
	// HealthzAddr and MetricsAddr are the agent's endpoints on the node
	// namespace's loopback; reach them with Node.HTTPGet.
	HealthzAddr, MetricsAddr string

	c       *Cluster
	mu      sync.Mutex
	nextPod netip.Addr
	links   int
}

// Pod is a backend "pod": a namespace on its node's pod bridge with a
// server answering with Name on netlab.ServerPort, TCP and UDP. Pods have
// no Pod objects; they appear in the API only as EndpointSlice endpoints
// (with nodeName set).
type Pod struct {
	Name string
	Node *Node
	NS   *netlab.NetNS
	IP   netip.Addr

	hostLink string
	server   *netlab.Server
	remove   sync.Once
	removed  error
}

// Addr is the pod's server address.
func (p *Pod) Addr() netip.AddrPort { return netip.AddrPortFrom(p.IP, netlab.ServerPort) }

// Host is a namespace on the fabric outside the cluster, with its default
// route via a node: where traffic comes from.
type Host struct {
	Name string
	NS   *netlab.NetNS
	IP   netip.Addr
	// Via is the node the host's default route leads to: its service and
	// pod traffic enters the cluster there.
	Via *Node
}

// ClientHost is the first client host, "client" (Clients[0], routed via
// node-1).
func (c *Cluster) ClientHost() *Host { return c.Clients[0] }

// Node returns the node called name, or nil.
func (c *Cluster) Node(name string) *Node {
	for _, n := range c.Nodes {
		if n.Name == name {
			return n
		}
	}
	return nil
}

// Service returns the demo Service called name, or nil.
func (c *Cluster) Service(name string) *Service {
	for _, s := range c.Services {
		if s.Name == name {
			return s
		}
	}
	return nil
}

// PodNames lists every pod's name, sorted.
func (c *Cluster) PodNames() []string {
	var names []string
	for _, p := range c.Pods {
		names = append(names, p.Name)
	}
	slices.Sort(names)
	return names
}

// Processes lists the running cluster's processes: etcd, kube-apiserver,
// the operator, then the agents.
func (c *Cluster) Processes() []*Process {
	var ps []*Process
	for _, p := range []*Process{c.Etcd, c.APIServer, c.Operator} {
		if p != nil {
			ps = append(ps, p)
		}
	}
	for _, n := range c.Nodes {
		if n.Agent != nil {
			ps = append(ps, n.Agent)
		}
	}
	return ps
}

func (c *Cluster) logf(format string, args ...any) { c.opts.Logf(format, args...) }

// step runs one step of Start and records its duration.
func (c *Cluster) step(name string, fn func() error) error {
	return harness.Step(&c.Timings, c.opts.Logf, name, fn)
}

func (o *Options) defaults() error {
	if o.Nodes == 0 {
		o.Nodes = 3
	}
	if o.Nodes < 1 || o.Nodes > MaxNodes {
		return fmt.Errorf("Nodes = %d: must be 1..%d", o.Nodes, MaxNodes)
	}
	if o.PodsPerNode == 0 {
		o.PodsPerNode = 2
	}
	if o.PodsPerNode < 0 || o.PodsPerNode > 200 {
		return fmt.Errorf("PodsPerNode = %d: must be 0..200", o.PodsPerNode)
	}
	if o.Mode == "" {
		o.Mode = v1alpha1.ModeNFTables
	}
	if o.ForwardAddr == "" {
		o.ForwardAddr = "127.0.0.1:0"
	}
	if ap, err := netip.ParseAddrPort(o.ForwardAddr); err != nil || !ap.Addr().IsLoopback() {
		return fmt.Errorf("ForwardAddr %q: must be a loopback address and port", o.ForwardAddr)
	}
	if o.StartTimeout == 0 {
		o.StartTimeout = 10 * time.Minute
	}
	if o.RepoDir == "" {
		o.RepoDir = RepoRoot()
	}
	if o.Logf == nil {
		o.Logf = harness.Quiet
	}
	return nil
}

// Start brings a cluster up: network, control plane, installation,
// Nodes, pods and Services, operator and agents. It returns once every
// agent is healthy and every demo Service answers from the first client.
// On failure (and when ctx ends) it tears down what it built and returns
// the error, naming the failed step and quoting the log of a process that
// exited. The caller must Close the returned cluster.
func Start(ctx context.Context, opts Options) (*Cluster, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("the local cluster needs root (network namespaces, netfilter)")
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

func (c *Cluster) start(ctx context.Context) error {
	o := &c.opts
	netlab.SweepStale(nsPrefix, c.logf)

	if err := c.step("run directory", func() (err error) {
		if c.run, err = harness.NewRunDir(o.RunDir, "proxyshift-cluster-"); err != nil {
			return err
		}
		c.RunDir, c.LogDir = c.run.Dir, c.run.LogDir
		c.childEnv = append(c.run.Env, "PATH="+os.Getenv("PATH"))
		return nil
	}); err != nil {
		return err
	}
	c.logf("run directory %s", c.RunDir)

	// Build the binaries while the network and the control plane come up.
	buildDone := make(chan error, 1)
	buildCtx, stopBuild := context.WithCancel(ctx)
	defer stopBuild()
	c.BinDir = o.BinDir
	if c.BinDir == "" {
		c.BinDir = filepath.Join(c.RunDir, "bin")
		go func() { buildDone <- Build(buildCtx, o.RepoDir, c.BinDir) }()
	} else {
		if err := checkBinaries(c.BinDir); err != nil {
			return err
		}
		buildDone <- nil
	}
	waitBuild := func() error {
		select {
		case err := <-buildDone:
			return err
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	buildWaited := false
	defer func() {
		if !buildWaited {
			stopBuild()
			<-buildDone // a failed start waits for go build to be gone
		}
	}()

	if err := c.step("control plane binaries", func() (err error) {
		c.AssetsDir, err = findAssets(ctx, o.AssetsDir, o.RepoDir)
		return err
	}); err != nil {
		return err
	}
	if err := c.step("certificates", func() (err error) {
		c.pki, err = controlplane.NewPKI(filepath.Join(c.RunDir, "pki"))
		return err
	}); err != nil {
		return err
	}
	if err := c.step("network namespaces", func() error { return c.buildNetwork(o) }); err != nil {
		return err
	}
	if err := c.step("etcd and kube-apiserver ready", func() error { return c.startControlPlane(ctx) }); err != nil {
		return err
	}
	if err := c.step("install CRDs, RBAC and admission policy (kubectl apply -k)", func() error { return c.install(ctx) }); err != nil {
		return err
	}
	if err := c.step("Nodes, ProxyNodes, Services", func() error { return c.createObjects(ctx) }); err != nil {
		return err
	}
	if err := c.step("ServiceAccount tokens", func() error { return c.writeCredentials(ctx) }); err != nil {
		return err
	}
	if err := c.step("build operator and agent", func() error {
		buildWaited = true
		return waitBuild()
	}); err != nil {
		return err
	}
	if err := c.step("operator and agents started", func() error { return c.startProxyshift() }); err != nil {
		return err
	}
	if err := c.step("agents healthy", func() error { return c.waitAgentsHealthy(ctx) }); err != nil {
		return err
	}
	if !o.NoServices {
		if err := c.step("services answer", func() error { return c.waitServices(ctx) }); err != nil {
			return err
		}
	}
	return nil
}

// buildNetwork creates the fabric, the control plane's namespace, the
// nodes with their pods and routes, and the first client.
func (c *Cluster) buildNetwork(o *Options) error {
	if err := c.buildFabric(); err != nil {
		return err
	}
	for i := 1; i <= o.Nodes; i++ {
		n, err := c.addNode(i)
		if err != nil {
			return err
		}
		c.Nodes = append(c.Nodes, n)
		for k := 1; k <= o.PodsPerNode; k++ {
			if _, err := n.AddPod(fmt.Sprintf("%s-pod-%d", n.Name, k)); err != nil {
				return err
			}
		}
	}
	if err := c.routeNodes(); err != nil {
		return err
	}
	_, err := c.AddClient("client", c.Nodes[0])
	return err
}

// Close tears the cluster down: agents and operator (SIGTERM, then
// SIGKILL), the forwarder, kube-apiserver and etcd, the pods' servers,
// every namespace, and the run directory (unless kept or given). It goes
// on past errors and returns them all; later calls return the same.
func (c *Cluster) Close() error {
	c.closeOnce.Do(func() { c.closeErr = c.close() })
	return c.closeErr
}

func (c *Cluster) close() error {
	var errs []error
	stopAll := func(ps []*Process, grace time.Duration) {
		var wg sync.WaitGroup
		var mu sync.Mutex
		for _, p := range ps {
			if p == nil {
				continue
			}
			wg.Go(func() {
				if err := p.Stop(grace); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			})
		}
		wg.Wait()
	}
	var agents []*Process
	for _, n := range c.Nodes {
		agents = append(agents, n.Agent)
	}
	stopAll(append(agents, c.Operator), 5*time.Second)
	if c.cp != nil {
		if err := c.cp.Stop(); err != nil {
			errs = append(errs, err)
		}
	}
	for _, p := range c.Pods {
		p.server.Stop() // its sockets would keep the namespace alive
	}
	if err := c.namespaces.DeleteAll(); err != nil {
		errs = append(errs, err)
	}
	if err := c.run.Remove(c.opts.KeepRunDir); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Summary describes the running cluster for a person: how to reach it,
// its nodes, pods and Services, and where the logs are.
func (c *Cluster) Summary() string {
	var b strings.Builder
	fmt.Fprintf(&b, "kubeconfig:  %s\n", c.Kubeconfig)
	fmt.Fprintf(&b, "             export KUBECONFIG=%s; kubectl get nodes,proxynodes\n", c.Kubeconfig)
	fmt.Fprintf(&b, "api server:  %s inside the lab, %s from this machine (loopback relay)\n", c.APIServerURL, "https://"+c.ForwardAddr)
	fmt.Fprintf(&b, "run dir:     %s\nlogs:        %s\n", c.RunDir, c.LogDir)
	fmt.Fprintf(&b, "nodes:\n")
	for _, n := range c.Nodes {
		var pods []string
		for _, p := range n.Pods {
			pods = append(pods, fmt.Sprintf("%s=%s", p.Name, p.IP))
		}
		fmt.Fprintf(&b, "  %-8s %-12s pods %-16s netns %-28s agent pid %d  %s\n", n.Name, n.IP, n.PodCIDR, n.NS.Name, n.Agent.Pid(), strings.Join(pods, " "))
	}
	if len(c.Services) > 0 {
		fmt.Fprintf(&b, "services (namespace %s):\n", ServicesNamespace)
		for _, s := range c.Services {
			extra := ""
			if s.NodePort != 0 {
				extra = fmt.Sprintf("  nodePort %d on every node IP", s.NodePort)
			}
			if s.Affinity {
				extra += "  sessionAffinity ClientIP"
			}
			fmt.Fprintf(&b, "  %-13s %-9s %s/%s%s\n", s.Name, s.Type, s.ClusterAddr(), s.Protocol, extra)
		}
	}
	for _, h := range c.Clients {
		fmt.Fprintf(&b, "client:      %s %s (netns %s, default route via %s)\n", h.Name, h.IP, h.NS.Name, h.Via.Name)
	}
	if len(c.Services) > 0 && len(c.Clients) > 0 {
		h, s := c.Clients[0], c.Services[0]
		fmt.Fprintf(&b, "try:         ip netns exec %s bash -c 'exec 3<>/dev/tcp/%s/%d; head -1 <&3'\n", h.NS.Name, s.ClusterIP, s.Port)
	}
	return b.String()
}
