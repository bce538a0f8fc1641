package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/proxyshift/proxyshift/test/harness"
	"github.com/proxyshift/proxyshift/test/netlab"
)

// Bring-up budget for a 3-node cluster once the binaries are built.
const bringUpBudget = 60 * time.Second

var (
	binOnce sync.Once
	binDir  string
	binErr  error
)

func TestMain(m *testing.M) {
	// The harness's controller-runtime client logs nothing worth seeing.
	ctrllog.SetLogger(zap.New(zap.WriteTo(io.Discard)))
	code := m.Run()
	if binDir != "" {
		_ = os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// sharedBinDir builds the operator and the agent once for all tests.
func sharedBinDir(t *testing.T) string {
	t.Helper()
	binOnce.Do(func() {
		binDir, binErr = os.MkdirTemp(processTempDir, "proxyshift-cluster-test-bin-")
		if binErr == nil {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
			defer cancel()
			binErr = Build(ctx, RepoRoot(), binDir)
		}
	})
	if binErr != nil {
		t.Fatalf("build the operator and the agent: %v", binErr)
	}
	return binDir
}

// start brings a cluster up for the test and closes it when the test ends.
func start(t *testing.T, opts Options) *Cluster {
	t.Helper()
	netlab.RequireRoot(t)
	opts.BinDir = sharedBinDir(t)
	opts.Logf = t.Logf
	c, err := Start(t.Context(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return c
}

// footprint is what a cluster leaves on the machine: its namespaces, its
// processes, its run directory.
type footprint struct {
	namespaces []string
	pids       []int
	runDir     string
}

func footprintOf(c *Cluster) footprint {
	f := footprint{runDir: c.RunDir, namespaces: c.namespaces.Names()}
	for _, p := range c.Processes() {
		if pid := p.Pid(); pid != 0 {
			f.pids = append(f.pids, pid)
		}
	}
	return f
}

// checkGone fails the test for every part of f still there.
func checkGone(t *testing.T, f footprint) {
	t.Helper()
	for _, name := range f.namespaces {
		if _, err := os.Stat(filepath.Join("/run/netns", name)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("namespace %s still there (%v)", name, err)
		}
	}
	for _, pid := range f.pids {
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("process %d still there (kill 0: %v)", pid, err)
		}
	}
	if f.runDir != "" {
		if _, err := os.Stat(f.runDir); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("run directory %s still there (%v)", f.runDir, err)
		}
	}
}

// tempEntries points the test's temporary directory at a private one (so
// that clusters started by other test packages running at the same time
// cannot show up) and lists the harness's directories in it.
func tempEntries(t *testing.T) []string {
	t.Helper()
	if !strings.HasPrefix(os.TempDir(), privateTempRoot) {
		dir, err := os.MkdirTemp(processTempDir, "proxyshift-private-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		t.Setenv("TMPDIR", dir)
	}
	ents, err := os.ReadDir(os.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "proxyshift-cluster-") && !strings.HasPrefix(e.Name(), "proxyshift-cluster-test-bin-") {
			names = append(names, e.Name())
		}
	}
	return names
}

// processTempDir is the temporary directory the test process started with;
// privateTempRoot is the prefix of os.TempDir() once tempEntries set it.
var (
	processTempDir  = os.TempDir()
	privateTempRoot = filepath.Join(processTempDir, "proxyshift-private-")
)

func nodeOf(c *Cluster, pod string) string {
	for _, p := range c.Pods {
		if p.Name == pod {
			return p.Node.Name
		}
	}
	return ""
}

// TestThreeNodeCluster brings up the default cluster and checks it the
// way its users will use it: services answer from the client with every
// pod across the nodes, over TCP and UDP, by cluster IP and by every
// node's NodePort; session affinity holds; the printed kubeconfig works
// with kubectl; the agents and the operator run with their own
// ServiceAccount tokens under config/rbac's roles; an agent can be killed
// and restarted.
func TestThreeNodeCluster(t *testing.T) {
	c := start(t, Options{})
	var upTime time.Duration
	for _, tm := range c.Timings {
		if tm.Step != "build operator and agent" {
			upTime += tm.Duration
		}
	}
	t.Logf("bring-up %.1fs (binaries prebuilt)", upTime.Seconds())
	if upTime > bringUpBudget {
		t.Errorf("bring-up took %v, budget %v: %v", upTime, bringUpBudget, c.Timings)
	}
	if len(c.Nodes) != 3 || len(c.Pods) != 6 || len(c.Services) != 4 || len(c.Clients) != 1 {
		t.Fatalf("%d nodes, %d pods, %d services, %d clients; want 3, 6, 4, 1", len(c.Nodes), len(c.Pods), len(c.Services), len(c.Clients))
	}
	client := c.ClientHost()
	allPods := c.PodNames()
	const n = 120
	const timeout = 2 * time.Second

	spreadAll := func(t *testing.T, proto netlab.Proto, addr string, tally netlab.Tally) {
		t.Helper()
		if tally.Answered() != n || !slices.Equal(tally.Names(), allPods) {
			t.Errorf("%d %s requests to %s: %v; want every pod of %v", n, proto, addr, tally, allPods)
		}
		nodes := map[string]bool{}
		for name := range tally.Answers {
			nodes[nodeOf(c, name)] = true
		}
		if len(nodes) != len(c.Nodes) {
			t.Errorf("%s to %s: answers from nodes %v only; traffic must cross to every node", proto, addr, nodes)
		}
	}

	t.Run("ClusterIP", func(t *testing.T) {
		s := c.Service(ServiceWeb)
		spreadAll(t, netlab.TCP, s.ClusterAddr().String(), client.NS.Spread(netlab.TCP, s.ClusterAddr(), n, timeout))
	})
	t.Run("NodePortOnEveryNode", func(t *testing.T) {
		s := c.Service(ServiceNodePort)
		if s.NodePort != NodePort {
			t.Fatalf("node port %d, want %d", s.NodePort, NodePort)
		}
		for _, node := range c.Nodes {
			addr := s.NodePortAddr(node)
			spreadAll(t, netlab.TCP, addr.String(), client.NS.Spread(netlab.TCP, addr, n, timeout))
		}
	})
	t.Run("UDP", func(t *testing.T) {
		s := c.Service(ServiceUDP)
		spreadAll(t, netlab.UDP, s.ClusterAddr().String(), client.NS.Spread(netlab.UDP, s.ClusterAddr(), n, timeout))
	})
	t.Run("ClientIPAffinity", func(t *testing.T) {
		s := c.Service(ServiceAffinity)
		tally := client.NS.Spread(netlab.TCP, s.ClusterAddr(), 30, timeout)
		if tally.Answered() != 30 || len(tally.Answers) != 1 {
			t.Errorf("30 requests to %s (ClientIP affinity): %v; want one pod for all", s.Name, tally)
		}
	})
	t.Run("PodToPodAcrossNodes", func(t *testing.T) {
		from, to := c.Nodes[0].Pods[0], c.Nodes[2].Pods[1]
		if got, err := from.NS.Request(netlab.TCP, to.Addr(), timeout); err != nil || got != to.Name {
			t.Errorf("%s to %s: %q, %v", from.Name, to.Name, got, err)
		}
	})

	t.Run("Kubectl", func(t *testing.T) {
		ctx := t.Context()
		out, err := c.Kubectl(ctx, "get", "nodes", "-o", "name")
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Fields(out); !slices.Equal(got, []string{"node/node-1", "node/node-2", "node/node-3"}) {
			t.Errorf("kubectl get nodes: %q", out)
		}
		out, err = c.Kubectl(ctx, "get", "nodes", "-o", `jsonpath={range .items[*]}{.metadata.name}={.status.addresses[?(@.type=="InternalIP")].address} {end}`)
		if err != nil {
			t.Fatal(err)
		}
		if want := "node-1=198.18.0.11 node-2=198.18.0.12 node-3=198.18.0.13"; strings.TrimSpace(out) != want {
			t.Errorf("InternalIPs %q, want %q", out, want)
		}
		out, err = c.Kubectl(ctx, "get", "proxynodes")
		if err != nil {
			t.Fatal(err)
		}
		for _, node := range c.Nodes {
			if !strings.Contains(out, node.Name) {
				t.Errorf("kubectl get proxynodes lacks %s:\n%s", node.Name, out)
			}
		}
		if _, err := c.Kubectl(ctx, "get", "proxyconfig"); err != nil {
			t.Error(err)
		}
		// The kubeconfig is for the root namespace: it names the loopback relay.
		kc, err := clientcmd.LoadFromFile(c.Kubeconfig)
		if err != nil {
			t.Fatal(err)
		}
		if server := kc.Clusters[kc.Contexts[kc.CurrentContext].Cluster].Server; server != "https://"+c.ForwardAddr || !strings.HasPrefix(c.ForwardAddr, "127.0.0.1:") {
			t.Errorf("kubeconfig server %q, forwarder %q", server, c.ForwardAddr)
		}
	})

	t.Run("Credentials", func(t *testing.T) {
		ctx := t.Context()
		// Each agent has its own token of the proxyshift-agent
		// ServiceAccount; config/rbac's role lets it write ProxyNode
		// status and read Services, not create ProxyNodes or touch Nodes.
		check := func(kubeconfig, wantUser, wantNode string, allowed, denied []authorizationv1.ResourceAttributes) {
			t.Helper()
			cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
			if err != nil {
				t.Fatal(err)
			}
			cfg.Dial = c.ControlPlane.DialContext
			kube, err := kubernetes.NewForConfig(cfg)
			if err != nil {
				t.Fatal(err)
			}
			review, err := kube.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
			if err != nil {
				t.Fatalf("%s: self subject review: %v", kubeconfig, err)
			}
			if got := review.Status.UserInfo.Username; got != wantUser {
				t.Errorf("%s authenticates as %q, want %q", filepath.Base(kubeconfig), got, wantUser)
			}
			// An agent's token is bound to a pod on its node: the API
			// server knows which node it speaks for (config/policy).
			if got := review.Status.UserInfo.Extra["authentication.kubernetes.io/node-name"]; wantNode != "" && fmt.Sprint(got) != "["+wantNode+"]" {
				t.Errorf("%s: node claim %v, want [%s]", filepath.Base(kubeconfig), got, wantNode)
			}
			for _, list := range []struct {
				attrs []authorizationv1.ResourceAttributes
				want  bool
			}{{allowed, true}, {denied, false}} {
				for _, a := range list.attrs {
					r, err := kube.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authorizationv1.SelfSubjectAccessReview{
						Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &a},
					}, metav1.CreateOptions{})
					if err != nil {
						t.Fatal(err)
					}
					if r.Status.Allowed != list.want {
						t.Errorf("%s: %s %s/%s allowed=%v, want %v", wantUser, a.Verb, a.Resource, a.Subresource, r.Status.Allowed, list.want)
					}
				}
			}
		}
		pn := func(verb, sub string) authorizationv1.ResourceAttributes {
			return authorizationv1.ResourceAttributes{Group: "network.proxyshift.io", Resource: "proxynodes", Subresource: sub, Verb: verb}
		}
		core := func(verb, res string) authorizationv1.ResourceAttributes {
			return authorizationv1.ResourceAttributes{Resource: res, Verb: verb}
		}
		seen := map[string]bool{}
		for _, node := range c.Nodes {
			b, err := os.ReadFile(node.Kubeconfig)
			if err != nil {
				t.Fatal(err)
			}
			if seen[string(b)] {
				t.Errorf("%s shares its credentials with another agent", node.Name)
			}
			seen[string(b)] = true
			check(node.Kubeconfig, "system:serviceaccount:proxyshift-system:proxyshift-agent", node.Name,
				[]authorizationv1.ResourceAttributes{pn("patch", "status"), pn("watch", ""), core("list", "services")},
				[]authorizationv1.ResourceAttributes{pn("create", ""), core("delete", "nodes"), core("get", "secrets")})
		}
		check(filepath.Join(c.RunDir, "operator.kubeconfig"), "system:serviceaccount:proxyshift-system:proxyshift-operator", "",
			[]authorizationv1.ResourceAttributes{pn("create", ""), pn("update", ""), core("list", "nodes")},
			[]authorizationv1.ResourceAttributes{core("delete", "nodes"), core("get", "secrets")})
	})

	t.Run("AgentMetrics", func(t *testing.T) {
		code, body, err := c.Nodes[0].HTTPGet(t.Context(), c.Nodes[0].MetricsAddr, "/metrics")
		if err != nil || code != 200 || !strings.Contains(body, "go_goroutines") {
			t.Errorf("metrics of node-1's agent: %d, %v, %.200q", code, err, body)
		}
	})

	t.Run("KillAndRestartAgent", func(t *testing.T) {
		node := c.Nodes[1]
		pid := node.Agent.Pid()
		if err := node.Agent.Kill(); err != nil {
			t.Fatal(err)
		}
		if node.Agent.Running() {
			t.Fatal("agent still running after Kill")
		}
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			t.Fatalf("agent pid %d still there after Kill: %v", pid, err)
		}
		if err := node.Agent.Start(); err != nil {
			t.Fatal(err)
		}
		if err := c.WaitAgentHealthy(t.Context(), node, 30*time.Second); err != nil {
			t.Fatal(err)
		}
		if err := node.Agent.Restart(); err != nil {
			t.Fatal(err)
		}
		if err := c.WaitAgentHealthy(t.Context(), node, 30*time.Second); err != nil {
			t.Fatal(err)
		}
		if log, _ := os.ReadFile(node.Agent.Log); strings.Count(string(log), ": start #") != 3 {
			t.Errorf("agent log %s does not show 3 starts", node.Agent.Log)
		}
		s := c.Service(ServiceWeb)
		if got, err := client.NS.Request(netlab.TCP, s.ClusterAddr(), timeout); err != nil {
			t.Errorf("after the restarts %s: %q, %v", s.Name, got, err)
		}
	})

	t.Run("NodeObjects", func(t *testing.T) {
		list, err := c.Kube.CoreV1().Nodes().List(t.Context(), metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, node := range list.Items {
			if node.Labels[corev1.LabelHostname] != node.Name {
				t.Errorf("node %s hostname label %q", node.Name, node.Labels[corev1.LabelHostname])
			}
		}
	})
}

// TestCloseLeavesNothingAndStartsAgain checks that Close removes every
// namespace, process and file, and that a second cluster comes up in the
// same process afterwards.
func TestCloseLeavesNothingAndStartsAgain(t *testing.T) {
	netlab.RequireRoot(t)
	before := tempEntries(t)
	home, _ := os.UserHomeDir()
	kubeDir := filepath.Join(home, ".kube")
	_, kubeDirErr := os.Stat(kubeDir)
	for round := 1; round <= 2; round++ {
		c, err := Start(t.Context(), Options{Nodes: 2, PodsPerNode: 1, BinDir: sharedBinDir(t), Logf: t.Logf})
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		s := c.Service(ServiceWeb)
		tally := c.ClientHost().NS.Spread(netlab.TCP, s.ClusterAddr(), 40, 2*time.Second)
		if tally.Answered() != 40 || len(tally.Answers) != 2 {
			t.Errorf("round %d: %v", round, tally)
		}
		f := footprintOf(c)
		if len(f.namespaces) != 1+1+2+2+1 || len(f.pids) != 2+1+2 {
			t.Errorf("round %d: %d namespaces, %d processes; want 7, 5", round, len(f.namespaces), len(f.pids))
		}
		if err := c.Close(); err != nil {
			t.Errorf("round %d: Close: %v", round, err)
		}
		checkGone(t, f)
	}
	if after := tempEntries(t); !slices.Equal(before, after) {
		t.Errorf("temporary directory entries before %v, after %v", before, after)
	}
	if _, err := os.Stat(kubeDir); (err == nil) != (kubeDirErr == nil) {
		t.Errorf("%s appeared or vanished: %v then %v", kubeDir, kubeDirErr, err)
	}
}

// TestFailedStartTearsDown makes the agents fail (an unknown flag) and
// checks that Start reports the agent's own words and leaves nothing.
func TestFailedStartTearsDown(t *testing.T) {
	netlab.RequireRoot(t)
	before := tempEntries(t)
	nsBefore := ourNamespaces(t)
	_, err := Start(t.Context(), Options{Nodes: 1, PodsPerNode: 1, BinDir: sharedBinDir(t), AgentArgs: []string{"--no-such-flag"}, Logf: t.Logf})
	if err == nil {
		t.Fatal("Start succeeded with agents that cannot start")
	}
	if !strings.Contains(err.Error(), "agent node-1 exited") || !strings.Contains(err.Error(), "no-such-flag") {
		t.Errorf("error does not name the agent and quote its log: %v", err)
	}
	if after := tempEntries(t); !slices.Equal(before, after) {
		t.Errorf("temporary directory entries before %v, after %v", before, after)
	}
	if after := ourNamespaces(t); !slices.Equal(nsBefore, after) {
		t.Errorf("namespaces before %v, after %v", nsBefore, after)
	}
}

func ourNamespaces(t *testing.T) []string {
	t.Helper()
	return namespacesWithPrefix(t, fmt.Sprintf("%s%d-", nsPrefix, os.Getpid()))
}

func namespacesWithPrefix(t *testing.T, prefix string) []string {
	t.Helper()
	names, err := netlab.NamedWithPrefix(prefix)
	if err != nil {
		t.Fatal(err)
	}
	return names
}

// TestProgramCtrlCAndCrash runs the program (hack/cluster) as a user
// would: it prints the kubeconfig, kubectl works with it from here, and
// Ctrl-C (SIGINT) removes everything. Then it kills a second run with
// SIGKILL: its processes die with it (Pdeathsig), and the namespaces it
// could not remove are swept by the next start.
func TestProgramCtrlCAndCrash(t *testing.T) {
	netlab.RequireRoot(t)
	bin := filepath.Join(t.TempDir(), "localcluster")
	build := exec.CommandContext(t.Context(), "go", "build", "-o", bin, "./hack/cluster")
	build.Dir = RepoRoot()
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./hack/cluster: %v\n%s", err, out)
	}
	assets, err := findAssets(t.Context(), "", RepoRoot())
	if err != nil {
		t.Fatal(err)
	}

	type run struct {
		cmd        *exec.Cmd
		kubeconfig string
		runDir     string
		netns      string // the prefix of its namespaces' names
	}
	launch := func() *run {
		t.Helper()
		p := harness.StartProgram(t, RepoRoot(), bin, []string{"-nodes", "1", "-pods-per-node", "1", "-bin-dir", sharedBinDir(t)}, "client:", 2*time.Minute)
		return &run{cmd: p.Cmd, kubeconfig: p.Value("kubeconfig"), runDir: p.Value("run dir"),
			netns: fmt.Sprintf("%s%d-", nsPrefix, p.Cmd.Process.Pid)}
	}
	agentPids := func(r *run) []int {
		out, _ := exec.Command("pgrep", "-f", "proxyshift-agent --kubeconfig="+r.runDir).Output()
		var pids []int
		for _, f := range strings.Fields(string(out)) {
			var pid int
			fmt.Sscan(f, &pid)
			pids = append(pids, pid)
		}
		return pids
	}

	r := launch()
	out, err := exec.Command(filepath.Join(assets, "kubectl"), "--kubeconfig", r.kubeconfig, "get", "nodes,proxynodes", "-o", "name").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "node/node-1") || !strings.Contains(string(out), "proxynode.network.proxyshift.io/node-1") {
		t.Errorf("kubectl with the printed kubeconfig: %v\n%s", err, out)
	}
	pids := agentPids(r)
	if len(pids) != 1 {
		t.Errorf("agent processes of the run: %v", pids)
	}
	if err := r.cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	if err := r.cmd.Wait(); err != nil {
		t.Errorf("the program after Ctrl-C: %v", err)
	}
	if left := namespacesWithPrefix(t, r.netns); len(left) != 0 {
		t.Errorf("namespaces left after Ctrl-C: %v", left)
	}
	checkGone(t, footprint{pids: pids, runDir: r.runDir})

	// A crash: the processes go with the harness; the namespaces stay
	// until the next start sweeps them.
	r = launch()
	pids = agentPids(r)
	if err := r.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = r.cmd.Wait()
	deadline := time.Now().Add(10 * time.Second)
	for _, pid := range pids {
		for syscall.Kill(pid, 0) == nil && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("agent %d survived the harness's SIGKILL", pid)
		}
	}
	if left := namespacesWithPrefix(t, r.netns); len(left) < 5 {
		t.Errorf("a killed harness should leave its namespaces; found %v", left)
	}
	netlab.SweepStale(nsPrefix, t.Logf)
	if left := namespacesWithPrefix(t, r.netns); len(left) != 0 {
		t.Errorf("namespaces left after the sweep: %v", left)
	}
	_ = os.RemoveAll(r.runDir) // a crashed run cannot remove its directory
}
