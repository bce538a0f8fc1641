package realcluster

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/proxyshift/proxyshift/api/contract"
	"github.com/proxyshift/proxyshift/api/v1alpha1"
	"github.com/proxyshift/proxyshift/nodeagent/switcher"
	"github.com/proxyshift/proxyshift/test/e2e"
	"github.com/proxyshift/proxyshift/test/netlab"
)

// deleteConfigAtEnd deletes ProxyConfig name when the test ends, so that
// a failed check does not leave it selecting every node for the next
// test (whose ProxyConfig would then only report a Conflict).
func deleteConfigAtEnd(t *testing.T, cl client.Client, name string) {
	t.Cleanup(func() {
		_ = cl.Delete(context.WithoutCancel(t.Context()), &v1alpha1.ProxyConfig{ObjectMeta: metav1.ObjectMeta{Name: name}})
	})
}

// rollout applies mode and waits for the rollout to finish, logging each
// change of the picture (and handing it to onChange).
func rollout(t *testing.T, c *Cluster, cl client.Client, name string, mode v1alpha1.ProxyMode, onChange func(e2e.Snapshot)) e2e.Snapshot {
	t.Helper()
	start := time.Now()
	gen, err := ApplyMode(t.Context(), cl, name, mode)
	if err != nil {
		t.Fatal(err)
	}
	deleteConfigAtEnd(t, cl, name)
	s, err := e2e.WaitDone(t.Context(), cl, name, gen, 10*time.Minute, func(s e2e.Snapshot) {
		t.Logf("%6.1fs %s", time.Since(start).Seconds(), s.Line())
		if onChange != nil {
			onChange(s)
		}
	})
	if err != nil {
		t.Fatalf("%v\n%s", err, debugState(t, c))
	}
	t.Logf("timing: rollout to %-10s %6.2fs", mode, time.Since(start).Seconds())
	return s
}

// podTraffic is the traffic of the migration: from inside the web pod on
// each node, a new connection every 250ms, alternately to the web
// Service's cluster IP and to the NodePort of the pod's own node, and one
// long-lived connection to the cluster IP, exchanged on after each step.
type podTraffic struct {
	c        *Cluster
	loops    map[string]*netlab.ClientLoop // by node
	sessions map[string]*netlab.Session
	closers  []func()
}

func startPodTraffic(t *testing.T, c *Cluster) *podTraffic {
	t.Helper()
	ctx := t.Context()
	ip, err := c.ClusterIP(ctx, WorkloadNamespace, WebService)
	if err != nil {
		t.Fatal(err)
	}
	pods, err := c.Kube.CoreV1().Pods(WorkloadNamespace).List(ctx, metav1.ListOptions{LabelSelector: WebSelector})
	if err != nil {
		t.Fatal(err)
	}
	pt := &podTraffic{c: c, loops: map[string]*netlab.ClientLoop{}, sessions: map[string]*netlab.Session{}}
	t.Cleanup(pt.close)
	clusterAddr := netip.AddrPortFrom(ip, WebPort)
	for _, p := range pods.Items {
		n := c.Node(p.Spec.NodeName)
		if n == nil || pt.loops[n.Name] != nil || p.DeletionTimestamp != nil || p.Status.Phase != corev1.PodRunning {
			continue
		}
		ns, closeNS, err := c.PodNetNS(ctx, WorkloadNamespace, p.Name)
		if err != nil {
			t.Fatal(err)
		}
		pt.closers = append(pt.closers, closeNS)
		s, err := ns.OpenSession(clusterAddr, 2*time.Second)
		if err != nil {
			t.Fatalf("pod %s: open a long-lived connection to %s: %v", p.Name, clusterAddr, err)
		}
		pt.sessions[n.Name] = s
		pt.loops[n.Name] = netlab.StartClientLoopEvery(t, ns, 250*time.Millisecond, clusterAddr, netip.AddrPortFrom(n.IP, WebNodePort))
	}
	for _, n := range c.Nodes {
		if pt.loops[n.Name] == nil {
			t.Fatalf("no running web pod on %s to send traffic from", n.Name)
		}
	}
	return pt
}

// check fails the test if a new connection failed so far or a long-lived
// one broke, and logs the counts.
func (pt *podTraffic) check(t *testing.T, after string) {
	t.Helper()
	for _, node := range slices.Sorted(maps.Keys(pt.loops)) {
		ok, failed := pt.loops[node].Counts()
		if failed > 0 {
			t.Errorf("%s, from %s: %d new connections failed (%d answered): %v\nwhat the node's proxies logged last:\n%s",
				after, node, failed, ok, pt.loops[node].Errors(), nodeLogs(t, pt.c, node))
		}
		if err := pt.sessions[node].Exchange(after, 3*time.Second); err != nil {
			t.Errorf("%s, from %s: the long-lived connection broke: %v", after, node, err)
		}
		t.Logf("%s, from %s: %d new connections answered, %d failed; the long-lived connection answers", after, node, ok, failed)
	}
}

func (pt *podTraffic) close() {
	for _, l := range pt.loops {
		l.Stop()
	}
	for _, s := range pt.sessions {
		s.Close()
	}
	for _, c := range pt.closers {
		c()
	}
	pt.closers = nil
}

// placementWatch checks, twice a second while a rollout runs, that
// kube-proxy's pod runs on every node proxyshift does not serve, and on
// none that proxyshift has taken over (Active in its mode): a node
// without a running kube-proxy pod must have a proxyshift mode serving
// it (status.activeMode) or be past verifying the mode it is taken over
// into (WaitingForKubeProxy, CleaningUp). ProxyNodes are read before and after the pods, and
// a node counts as not served by proxyshift only if both reads say so.
//
// A takeover past verifying stays one while the node's agent restarts
// (the test deletes agent pods in the middle of takeovers): the rules
// it verified stay in the kernel and serve, and the new agent reports
// the switch from Preparing again, with kube-proxy as the active mode
// until it has verified them anew. So a node once taken over into the
// desired mode counts as served by it until its ProxyNode leaves that
// switch (Active, Failed, Idle, or another desired mode).
type placementWatch struct {
	mu         sync.Mutex
	samples    int
	violations []string
	// takenOver is the mode each node was seen taken over into, in the
	// switch still under way.
	takenOver  map[string]v1alpha1.ProxyMode
	stop, done chan struct{}
}

func watchPlacement(t *testing.T, c *Cluster, cl client.Client) *placementWatch {
	w := &placementWatch{takenOver: map[string]v1alpha1.ProxyMode{}, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		for {
			select {
			case <-w.stop:
				return
			case <-time.After(500 * time.Millisecond):
			}
			w.sample(t.Context(), c, cl)
		}
	}()
	t.Cleanup(w.finish)
	return w
}

func (w *placementWatch) sample(ctx context.Context, c *Cluster, cl client.Client) {
	served := func() map[string]string {
		var l v1alpha1.ProxyNodeList
		if err := cl.List(ctx, &l); err != nil {
			return nil
		}
		out := map[string]string{}
		w.mu.Lock()
		defer w.mu.Unlock()
		for _, pn := range l.Items {
			st := pn.Status
			desired := pn.Spec.DesiredMode
			// Taking a node over, from WaitingForKubeProxy on the new
			// mode is programmed, verified and serves; kube-proxy is
			// reported active until its objects are gone.
			takenOver := (st.Phase == v1alpha1.NodeWaitingForKubeProxy || st.Phase == v1alpha1.NodeCleaningUp) && contract.ValidMode(desired)
			switch {
			case takenOver:
				w.takenOver[pn.Name] = desired
			case !switcher.Switching(st.Phase) || w.takenOver[pn.Name] != desired:
				delete(w.takenOver, pn.Name)
			}
			if contract.ValidMode(st.ActiveMode) || takenOver {
				out[pn.Name] = e2e.NodeText(pn)
			} else if w.takenOver[pn.Name] != "" {
				out[pn.Name] = e2e.NodeText(pn) + " (resuming its takeover)"
			}
			if st.Phase == v1alpha1.NodeActive && contract.ValidMode(st.ActiveMode) && pn.Spec.DesiredMode != v1alpha1.ModeKubeProxy {
				out[pn.Name] += " (taken over)"
			}
		}
		return out
	}
	before := served()
	pods, err := c.Kube.CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{LabelSelector: KubeProxySelector})
	after := served()
	if before == nil || after == nil || err != nil {
		return
	}
	running, present := map[string]bool{}, map[string]bool{}
	for _, p := range pods.Items {
		present[p.Spec.NodeName] = true
		if p.Status.Phase == corev1.PodRunning {
			running[p.Spec.NodeName] = true
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.samples++
	now := time.Now().Format("15:04:05.000")
	for _, n := range c.Nodes {
		if len(w.violations) >= 20 {
			break
		}
		if !running[n.Name] && before[n.Name] == "" && after[n.Name] == "" {
			w.violations = append(w.violations, fmt.Sprintf("%s: %s has no running kube-proxy pod and proxyshift does not serve it", now, n.Name))
		}
		// The converse: a node taken over (Active in a proxyshift mode
		// in both reads) has no kube-proxy pod at all, since its rules
		// are removed only once the pod has left.
		if present[n.Name] && strings.HasSuffix(before[n.Name], "(taken over)") && strings.HasSuffix(after[n.Name], "(taken over)") {
			w.violations = append(w.violations, fmt.Sprintf("%s: %s is taken over (%s) but a kube-proxy pod is on it", now, n.Name, after[n.Name]))
		}
	}
}

func (w *placementWatch) finish() {
	select {
	case <-w.stop:
	default:
		close(w.stop)
	}
	<-w.done
}

// check stops the watch and fails the test on a violation.
func (w *placementWatch) check(t *testing.T) {
	t.Helper()
	w.finish()
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.violations) > 0 {
		t.Errorf("kube-proxy was absent from nodes proxyshift did not serve (%d samples):\n  %s", w.samples, strings.Join(w.violations, "\n  "))
	} else {
		t.Logf("kube-proxy ran on every node proxyshift did not serve, in all %d samples taken during the rollouts", w.samples)
	}
}

// kubeProxyNodes are the nodes a kube-proxy pod is on (any phase).
func kubeProxyNodes(t *testing.T, c *Cluster) []string {
	t.Helper()
	pods, err := c.Kube.CoreV1().Pods("kube-system").List(t.Context(), metav1.ListOptions{LabelSelector: KubeProxySelector})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, p := range pods.Items {
		out = append(out, p.Spec.NodeName)
	}
	slices.Sort(out)
	return out
}

// nodeNames are the names of the cluster's nodes.
func nodeNames(c *Cluster) []string {
	out := make([]string, 0, len(c.Nodes))
	for _, n := range c.Nodes {
		out = append(out, n.Name)
	}
	return out
}

// requirePlacement waits (a minute at most: a pod that left may still be
// terminating, one that returns may be starting) until kube-proxy runs
// exactly on nodes.
func requirePlacement(t *testing.T, c *Cluster, nodes []string) {
	t.Helper()
	slices.Sort(nodes)
	waitUntil(t, c, fmt.Sprintf("kube-proxy running exactly on %v", nodes), func(ctx context.Context) error {
		pods, err := c.Kube.CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{LabelSelector: KubeProxySelector})
		if err != nil {
			return err
		}
		var on []string
		for _, p := range pods.Items {
			if p.Status.Phase != corev1.PodRunning || p.DeletionTimestamp != nil {
				return fmt.Errorf("pod %s on %s is %s (deleting: %v)", p.Name, p.Spec.NodeName, p.Status.Phase, p.DeletionTimestamp != nil)
			}
			on = append(on, p.Spec.NodeName)
		}
		slices.Sort(on)
		if !slices.Equal(on, nodes) {
			return fmt.Errorf("kube-proxy runs on %v", on)
		}
		return nil
	})
}

// requireOwner checks that every node's kernel holds only owner's objects:
// kube-proxy's, or those of one of proxyshift's modes.
func requireOwner(t *testing.T, c *Cluster, owner v1alpha1.ProxyMode) {
	t.Helper()
	for _, n := range c.Nodes {
		o, err := n.Objects(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		switch owner {
		case v1alpha1.ModeKubeProxy:
			if len(o.Proxyshift) > 0 {
				t.Errorf("%s: proxyshift's objects left after the hand-back: %v", n.Name, o.Proxyshift)
			}
			if !slices.ContainsFunc(o.KubeProxy, func(s string) bool { return strings.HasSuffix(s, " nat KUBE-SERVICES") }) {
				t.Errorf("%s: kube-proxy's KUBE-SERVICES is not there: %v", n.Name, o.KubeProxy)
			}
		default:
			if len(o.KubeProxy) > 0 {
				t.Errorf("%s: kube-proxy's objects left after the takeover: %v", n.Name, o.KubeProxy)
			}
			nftOwn := slices.ContainsFunc(o.Proxyshift, func(s string) bool { return strings.HasPrefix(s, "nft ") && strings.HasSuffix(s, " proxyshift") })
			iptOwn := slices.ContainsFunc(o.Proxyshift, func(s string) bool { return strings.Contains(s, "PROXYSHIFT-") })
			if owner == v1alpha1.ModeNFTables && (!nftOwn || iptOwn) || owner == v1alpha1.ModeIPTables && (nftOwn || !iptOwn) {
				t.Errorf("%s: want only proxyshift's %s objects, the kernel holds %v", n.Name, owner, o.Proxyshift)
			}
		}
	}
}

// requireServedBy checks every ProxyNode reports owner serving, Active.
func requireServedBy(t *testing.T, s e2e.Snapshot, owner v1alpha1.ProxyMode) {
	t.Helper()
	if s.Config.Status.Phase != v1alpha1.RolloutCompleted {
		t.Fatalf("the rollout to %s ended %s: %+v", owner, s.Config.Status.Phase, s.Config.Status.FailedNodes)
	}
	for _, pn := range s.Nodes {
		if pn.Status.ActiveMode != owner || pn.Status.Phase != v1alpha1.NodeActive {
			t.Errorf("%s: %s, want %s Active", pn.Name, e2e.NodeText(pn), owner)
		}
	}
}

// checkMigration is the migration users make, under continuous traffic
// from pods on every node: kube-proxy (iptables) → proxyshift nftables →
// proxyshift iptables → kube-proxy, each a rollout of one canary and then
// one node at a time. During the takeover the agent pod of the canary,
// and later the operator's pod, are deleted in the middle of a node's
// switch. After each step: no failed connection, the long-lived ones
// answer, kube-proxy runs exactly where it should (and, sampled all
// along, never left a node proxyshift did not serve), each node's
// kernel holds only the new owner's objects, and port 10256's /healthz
// and /livez answer from the owner (kube-proxy, or the agent in its
// place). At the end the kube-proxy
// DaemonSet and the nodes are as they were before.
func checkMigration(t *testing.T, c *Cluster, cl client.Client) {
	ctx := t.Context()
	dsBefore, err := c.Kube.AppsV1().DaemonSets("kube-system").Get(ctx, "kube-proxy", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	all := nodeNames(c)
	traffic := startPodTraffic(t, c)
	placement := watchPlacement(t, c, cl)
	const name = "migrate"
	requireKubeProxyHealthz(t, c, false)

	killer := &midSwitchKiller{t: t, c: c}
	s := rollout(t, c, cl, name, v1alpha1.ModeNFTables, killer.onChange)
	requireServedBy(t, s, v1alpha1.ModeNFTables)
	killer.require()
	requirePlacement(t, c, nil)
	requireOwner(t, c, v1alpha1.ModeNFTables)
	requireKubeProxyHealthz(t, c, true)
	traffic.check(t, "kube-proxy → nftables")

	s = rollout(t, c, cl, name, v1alpha1.ModeIPTables, nil)
	requireServedBy(t, s, v1alpha1.ModeIPTables)
	requirePlacement(t, c, nil)
	requireOwner(t, c, v1alpha1.ModeIPTables)
	traffic.check(t, "nftables → iptables")

	s = rollout(t, c, cl, name, v1alpha1.ModeKubeProxy, nil)
	requireServedBy(t, s, v1alpha1.ModeKubeProxy)
	requirePlacement(t, c, all)
	requireOwner(t, c, v1alpha1.ModeKubeProxy)
	requireKubeProxyHealthz(t, c, false)
	traffic.check(t, "iptables → kube-proxy")
	placement.check(t)

	// Everything proxyshift added to kube-proxy's DaemonSet and the
	// nodes is gone once every node is back.
	waitUntil(t, c, "kube-proxy's DaemonSet as it was", func(ctx context.Context) error {
		ds, err := c.Kube.AppsV1().DaemonSets("kube-system").Get(ctx, "kube-proxy", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if got, want := fmt.Sprint(ds.Spec.Template.Spec.Affinity), fmt.Sprint(dsBefore.Spec.Template.Spec.Affinity); got != want {
			return fmt.Errorf("affinity %s, was %s", got, want)
		}
		if got, want := fmt.Sprint(ds.Spec.UpdateStrategy), fmt.Sprint(dsBefore.Spec.UpdateStrategy); got != want {
			return fmt.Errorf("update strategy %s, was %s", got, want)
		}
		for k := range ds.Annotations {
			if strings.Contains(k, "proxyshift") {
				return fmt.Errorf("annotation %s is still there", k)
			}
		}
		return nil
	})
	nodes, err := c.Kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes.Items {
		for k := range n.Labels {
			if strings.Contains(k, "proxyshift") {
				t.Errorf("%s still carries the label %s", n.Name, k)
			}
		}
	}
	if err := cl.Delete(ctx, &v1alpha1.ProxyConfig{ObjectMeta: metav1.ObjectMeta{Name: name}}); err != nil {
		t.Fatal(err)
	}
}

// midSwitchKiller deletes, during the takeover, the agent pod of the
// first node seen waiting for kube-proxy to leave, and the operator's pod
// once a second node is switching: both must converge from what the API
// and the kernel say.
type midSwitchKiller struct {
	t                        *testing.T
	c                        *Cluster
	agentKilled, operatorGot string
}

func (k *midSwitchKiller) onChange(s e2e.Snapshot) {
	for _, pn := range s.Nodes {
		switching := pn.Spec.DesiredMode == v1alpha1.ModeNFTables && slices.Contains([]v1alpha1.NodePhase{
			v1alpha1.NodePreparing, v1alpha1.NodeProgramming, v1alpha1.NodeVerifying, v1alpha1.NodeWaitingForKubeProxy,
		}, pn.Status.Phase)
		switch {
		case k.agentKilled == "" && pn.Status.Phase == v1alpha1.NodeWaitingForKubeProxy:
			k.agentKilled = pn.Name
			k.deletePod("proxyshift-system", "app.kubernetes.io/component=agent", pn.Name)
		case k.agentKilled != "" && k.operatorGot == "" && switching && pn.Name != k.agentKilled:
			k.operatorGot = pn.Name
			k.deletePod("proxyshift-system", "app.kubernetes.io/component=operator", "")
		}
	}
}

// deletePod deletes the pod matching selector (on node, if set).
func (k *midSwitchKiller) deletePod(namespace, selector, node string) {
	ctx := k.t.Context()
	pods, err := k.c.Kube.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		k.t.Errorf("list %s: %v", selector, err)
		return
	}
	for _, p := range pods.Items {
		if node != "" && p.Spec.NodeName != node {
			continue
		}
		if err := k.c.Kube.CoreV1().Pods(namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](1)}); err != nil {
			k.t.Errorf("delete pod %s: %v", p.Name, err)
			continue
		}
		k.t.Logf("deleted pod %s/%s (on %s) in the middle of the takeover", namespace, p.Name, p.Spec.NodeName)
	}
}

func (k *midSwitchKiller) require() {
	if k.agentKilled == "" || k.operatorGot == "" {
		k.t.Errorf("the takeover ended before both kills happened (agent on %q, operator while %q switched)", k.agentKilled, k.operatorGot)
	}
}

// checkFailedTakeover makes every agent fail its verification (the test
// hook --test-fail-verify, added to the agent DaemonSet's arguments) and
// applies an nftables ProxyConfig: the canary fails, is given back to
// kube-proxy, the other nodes are never touched, and the ProxyConfig is
// Failed naming the canary. The hook and the ProxyConfig are then
// removed.
func checkFailedTakeover(t *testing.T, c *Cluster, cl client.Client) {
	ctx := t.Context()
	setAgentArg(t, c, "--test-fail-verify", true)
	traffic := startPodTraffic(t, c)
	const name = "fails-verify"
	s := rollout(t, c, cl, name, v1alpha1.ModeNFTables, nil)
	st := s.Config.Status
	if st.Phase != v1alpha1.RolloutFailed || len(st.FailedNodes) != 1 {
		t.Fatalf("the rollout ended %s with failed nodes %+v; want Failed naming the canary", st.Phase, st.FailedNodes)
	}
	canary := st.FailedNodes[0].Name
	t.Logf("failed: %s: %s", canary, st.FailedNodes[0].Reason)
	for _, pn := range s.Nodes {
		if pn.Status.ActiveMode != v1alpha1.ModeKubeProxy {
			t.Errorf("%s: %s; want kube-proxy serving again", pn.Name, e2e.NodeText(pn))
		}
		if pn.Name != canary && pn.Spec.DesiredMode != "" {
			t.Errorf("%s, not the canary, was asked for %s", pn.Name, pn.Spec.DesiredMode)
		}
	}
	all := nodeNames(c)
	requirePlacement(t, c, all)
	requireOwner(t, c, v1alpha1.ModeKubeProxy)
	traffic.check(t, "a failed takeover of "+canary)
	traffic.close()
	if err := cl.Delete(ctx, &v1alpha1.ProxyConfig{ObjectMeta: metav1.ObjectMeta{Name: name}}); err != nil {
		t.Fatal(err)
	}
	setAgentArg(t, c, "--test-fail-verify", false)
}

// setAgentArg adds arg to the agent DaemonSet's container arguments (or
// removes it) and waits for the DaemonSet's roll. It works in a test's
// cleanup too.
func setAgentArg(t *testing.T, c *Cluster, arg string, add bool) {
	t.Helper()
	ctx := context.WithoutCancel(t.Context())
	ds, err := c.Kube.AppsV1().DaemonSets("proxyshift-system").Get(ctx, "proxyshift-agent", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ctr := &ds.Spec.Template.Spec.Containers[0]
	ctr.Args = slices.DeleteFunc(ctr.Args, func(a string) bool { return a == arg })
	if add {
		ctr.Args = append(ctr.Args, arg)
	}
	if _, err := c.Kube.AppsV1().DaemonSets("proxyshift-system").Update(ctx, ds, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if out, err := c.Kubectl(ctx, "-n", "proxyshift-system", "rollout", "status", "daemonset/proxyshift-agent", "--timeout=3m"); err != nil {
		t.Fatalf("agent DaemonSet rollout: %v\n%s", err, out)
	}
}

// nodeLogs is the end of what the proxyshift agent and kube-proxy on
// node logged, with the times to read a failed connection's against.
func nodeLogs(t *testing.T, c *Cluster, node string) string {
	ctx := context.WithoutCancel(t.Context())
	var b strings.Builder
	for _, q := range []struct{ namespace, selector string }{
		{"proxyshift-system", "app.kubernetes.io/component=agent"},
		{"kube-system", "k8s-app=kube-proxy"},
	} {
		pods, err := c.Kube.CoreV1().Pods(q.namespace).List(ctx, metav1.ListOptions{LabelSelector: q.selector, FieldSelector: "spec.nodeName=" + node})
		if err != nil {
			fmt.Fprintf(&b, "list the pods %s on %s: %v\n", q.selector, node, err)
			continue
		}
		for _, p := range pods.Items {
			runs := [][]string{{"--tail=300"}}
			if slices.ContainsFunc(p.Status.ContainerStatuses, func(s corev1.ContainerStatus) bool { return s.RestartCount > 0 }) {
				// What the container logged before its restart.
				runs = append([][]string{{"--previous", "--tail=100"}}, runs...)
			}
			for _, run := range runs {
				args := append([]string{"-n", q.namespace, "logs", p.Name, "--all-containers", "--timestamps"}, run...)
				out, err := c.Kubectl(ctx, args...)
				fmt.Fprintf(&b, "$ kubectl %s (%v)\n%s\n", strings.Join(args, " "), err, out)
			}
		}
	}
	return b.String()
}

// debugState is what a person would look at when a rollout does not
// finish: the ProxyConfigs and ProxyNodes, the pods of kube-proxy and
// proxyshift, the recent events, and the operator's log tail.
func debugState(t *testing.T, c *Cluster) string {
	ctx := context.WithoutCancel(t.Context())
	var b strings.Builder
	for _, args := range [][]string{
		{"get", "proxyconfigs,proxynodes", "-o", "wide"},
		{"get", "pods", "-A", "-o", "wide"},
		{"get", "events", "-A", "--sort-by=.lastTimestamp"},
		{"-n", "proxyshift-system", "logs", "deployment/proxyshift-operator", "--tail=80"},
	} {
		out, err := c.Kubectl(ctx, args...)
		fmt.Fprintf(&b, "$ kubectl %s (%v)\n%s\n", strings.Join(args, " "), err, out)
	}
	return b.String()
}
