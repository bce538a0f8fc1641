// Package e2e holds proxyshift's end-to-end tests and the helpers they
// share with the demo (hack/demo-lab, hack/demo): a bounded traffic generator that runs
// from client namespaces of a test/cluster local cluster, ProxyConfig
// helpers, waits on the rollout, and a check of what each node's kernel
// holds of proxyshift's modes.
//
// Everything runs against a cluster made by test/cluster: traffic stays
// inside the lab's namespaces (198.18.0.0/15) and the kernel checks run
// `ip netns exec <node namespace> ...`, never in the root namespace.
package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
	"github.com/proxyshift/proxyshift/test/cluster"
	"github.com/proxyshift/proxyshift/test/netlab"
)

// Target is one address traffic is sent to, from one client host.
type Target struct {
	// Name labels the target in reports ("web via node-1").
	Name string
	// From is the namespace the requests are sent from.
	From *netlab.NetNS
	Addr netip.AddrPort
}

// Targets are the demo's traffic targets: the web Service's ClusterIP from
// one client per node (each client's traffic enters the cluster at its
// node, so every node's proxy translates some of it), and the NodePort on
// every node from the first client. It adds the clients it needs
// ("client-2", ... via node-2, ...).
func Targets(c *cluster.Cluster) ([]Target, error) {
	web := c.Service(cluster.ServiceWeb)
	np := c.Service(cluster.ServiceNodePort)
	if web == nil || np == nil {
		return nil, fmt.Errorf("the cluster has no %s/%s Services", cluster.ServiceWeb, cluster.ServiceNodePort)
	}
	var ts []Target
	for i, n := range c.Nodes {
		h := clientVia(c, n)
		if h == nil {
			var err error
			if h, err = c.AddClient(fmt.Sprintf("client-%d", i+1), n); err != nil {
				return nil, err
			}
		}
		ts = append(ts, Target{Name: "ClusterIP via " + n.Name, From: h.NS, Addr: web.ClusterAddr()})
	}
	for _, n := range c.Nodes {
		ts = append(ts, Target{Name: "NodePort " + n.Name, From: c.ClientHost().NS, Addr: np.NodePortAddr(n)})
	}
	return ts, nil
}

func clientVia(c *cluster.Cluster, n *cluster.Node) *cluster.Host {
	for _, h := range c.Clients {
		if h.Via == n {
			return h
		}
	}
	return nil
}

// Traffic sends TCP requests (connect, read the pod's name) round robin to
// its targets at a fixed rate until stopped, with at most a few requests in
// flight at once. Each request is a new connection, so each one is
// translated by the rules the node holds at that moment.
type Traffic struct {
	Sent, Failed atomic.Int64

	mu       sync.Mutex
	byTarget map[string]*TargetTally
	failures []string // the first failures, for messages
	answers  map[string]int

	stop chan struct{}
	done chan struct{}
}

// TargetTally is one target's count.
type TargetTally struct{ Sent, Failed int }

// StartTraffic starts sending rate requests per second (bounded to 1..500)
// with a per-request timeout, until Stop or ctx ends.
func StartTraffic(ctx context.Context, targets []Target, rate int, timeout time.Duration) *Traffic {
	rate = max(1, min(rate, 500))
	t := &Traffic{byTarget: map[string]*TargetTally{}, answers: map[string]int{}, stop: make(chan struct{}), done: make(chan struct{})}
	for _, tg := range targets {
		t.byTarget[tg.Name] = &TargetTally{}
	}
	go t.run(ctx, targets, rate, timeout)
	return t
}

func (t *Traffic) run(ctx context.Context, targets []Target, rate int, timeout time.Duration) {
	defer close(t.done)
	var wg sync.WaitGroup
	defer wg.Wait()
	// At most this many requests in flight: a black hole makes requests
	// wait for their timeout, and the generator must stay bounded then too.
	inflight := make(chan struct{}, 64)
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return
		case <-t.stop:
			return
		case <-tick.C:
		}
		select {
		case inflight <- struct{}{}:
		default:
			continue // saturated: skip this tick rather than queue
		}
		tg := targets[i%len(targets)]
		wg.Go(func() {
			defer func() { <-inflight }()
			name, err := tg.From.Request(netlab.TCP, tg.Addr, timeout)
			t.Sent.Add(1)
			t.mu.Lock()
			defer t.mu.Unlock()
			tt := t.byTarget[tg.Name]
			tt.Sent++
			if err != nil {
				t.Failed.Add(1)
				tt.Failed++
				if len(t.failures) < 20 {
					t.failures = append(t.failures, fmt.Sprintf("%s %s: %s: %v", time.Now().Format("15:04:05.000"), tg.Name, netlab.KindOf(err), err))
				}
				return
			}
			t.answers[name]++
		})
	}
}

// Stop stops sending and waits for the requests in flight.
func (t *Traffic) Stop() {
	select {
	case <-t.stop:
	default:
		close(t.stop)
	}
	<-t.done
}

// Failures are the first (at most 20) failed requests, described.
func (t *Traffic) Failures() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return slices.Clone(t.failures)
}

// ByTarget is each target's count, by target name.
func (t *Traffic) ByTarget() map[string]TargetTally {
	t.mu.Lock()
	defer t.mu.Unlock()
	m := map[string]TargetTally{}
	for k, v := range t.byTarget {
		m[k] = *v
	}
	return m
}

// Answers counts the answers by the pod that answered.
func (t *Traffic) Answers() map[string]int {
	t.mu.Lock()
	defer t.mu.Unlock()
	m := map[string]int{}
	for k, v := range t.answers {
		m[k] = v
	}
	return m
}

// ConfigName is the ProxyConfig the tests and the demo use.
const ConfigName = "cluster-mode"

// NewProxyConfig is a ProxyConfig selecting every node, with the lab's
// cluster CIDR, short sync periods and a short node timeout: one canary
// node, then one node at a time, rolling back on failure.
func NewProxyConfig(name string, mode v1alpha1.ProxyMode, nodeTimeout time.Duration) *v1alpha1.ProxyConfig {
	pc := &v1alpha1.ProxyConfig{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1alpha1.ProxyConfigSpec{
			Rollout: v1alpha1.RolloutPolicy{
				MaxUnavailable: ptr.To(intstr.FromInt32(1)),
				Canary:         v1alpha1.CanaryPolicy{Nodes: ptr.To[int32](1)},
				NodeTimeout:    v1alpha1.Duration(nodeTimeout.String()),
				AutoRollback:   ptr.To(true),
			},
		},
	}
	SetMode(pc, mode)
	return pc
}

// SetMode sets spec.mode and the matching settings section (the API
// rejects settings for another mode than spec.mode).
func SetMode(pc *v1alpha1.ProxyConfig, mode v1alpha1.ProxyMode) {
	pc.Spec.Mode = mode
	pc.Spec.ClusterCIDRs = []v1alpha1.CIDR{v1alpha1.CIDR(cluster.ClusterCIDR.String())}
	pc.Spec.IPTables, pc.Spec.NFTables, pc.Spec.IPVS = nil, nil, nil
	switch mode {
	case v1alpha1.ModeIPTables:
		pc.Spec.IPTables = &v1alpha1.IPTablesSettings{MinSyncPeriod: "500ms", SyncPeriod: "30s"}
	case v1alpha1.ModeNFTables:
		pc.Spec.NFTables = &v1alpha1.NFTablesSettings{MinSyncPeriod: "500ms", SyncPeriod: "30s"}
	}
}

// ApplyMode creates the ProxyConfig name in mode, or sets the mode of the
// existing one. It returns the generation that carries the mode.
func ApplyMode(ctx context.Context, c client.Client, name string, mode v1alpha1.ProxyMode, nodeTimeout time.Duration) (int64, error) {
	return ApplyModeWith(ctx, c, name, mode, nodeTimeout, nil)
}

// ApplyModeWith is ApplyMode with edit (when set) applied to the
// ProxyConfig after its mode is set, before it is written: other
// settings a test needs.
func ApplyModeWith(ctx context.Context, c client.Client, name string, mode v1alpha1.ProxyMode, nodeTimeout time.Duration, edit func(*v1alpha1.ProxyConfig)) (int64, error) {
	if edit == nil {
		edit = func(*v1alpha1.ProxyConfig) {}
	}
	for attempt := 0; attempt < 10; attempt++ {
		pc := &v1alpha1.ProxyConfig{}
		err := c.Get(ctx, client.ObjectKey{Name: name}, pc)
		if apierrors.IsNotFound(err) {
			pc = NewProxyConfig(name, mode, nodeTimeout)
			edit(pc)
			if err := c.Create(ctx, pc); err != nil {
				if apierrors.IsAlreadyExists(err) {
					continue
				}
				return 0, err
			}
			return pc.Generation, nil
		}
		if err != nil {
			return 0, err
		}
		SetMode(pc, mode)
		edit(pc)
		if err := c.Update(ctx, pc); err != nil {
			if apierrors.IsConflict(err) {
				continue
			}
			return 0, err
		}
		return pc.Generation, nil
	}
	return 0, fmt.Errorf("could not update ProxyConfig %s: kept conflicting", name)
}

// Snapshot is what the API says of the rollout at one moment.
type Snapshot struct {
	Config *v1alpha1.ProxyConfig
	Nodes  []v1alpha1.ProxyNode // sorted by name
}

// Take reads the ProxyConfig name and every ProxyNode.
func Take(ctx context.Context, c client.Client, name string) (Snapshot, error) {
	var s Snapshot
	pc := &v1alpha1.ProxyConfig{}
	if err := c.Get(ctx, client.ObjectKey{Name: name}, pc); err != nil {
		return s, err
	}
	s.Config = pc
	var l v1alpha1.ProxyNodeList
	if err := c.List(ctx, &l); err != nil {
		return s, err
	}
	s.Nodes = l.Items
	slices.SortFunc(s.Nodes, func(a, b v1alpha1.ProxyNode) int { return strings.Compare(a.Name, b.Name) })
	return s, nil
}

// Done says whether the ProxyConfig's status describes generation gen and
// a finished rollout (Completed or Failed).
func (s Snapshot) Done(gen int64) bool {
	st := s.Config.Status
	return st.ObservedGeneration >= gen && (st.Phase == v1alpha1.RolloutCompleted || st.Phase == v1alpha1.RolloutFailed)
}

// Line is a one-line description of the rollout: the config's phase and
// counts, then each node's desired/active mode and phase.
func (s Snapshot) Line() string {
	st := s.Config.Status
	var b strings.Builder
	fmt.Fprintf(&b, "%-11s %d/%d updated", orDash(string(st.Phase)), st.Nodes.Updated, st.Nodes.Selected)
	for _, n := range s.Nodes {
		fmt.Fprintf(&b, " | %s %s", n.Name, NodeText(n))
	}
	return b.String()
}

// NodeText describes one ProxyNode: "nftables Active", or
// "iptables→nftables Programming" during a switch.
func NodeText(n v1alpha1.ProxyNode) string {
	active, desired := string(n.Status.ActiveMode), string(n.Spec.DesiredMode)
	mode := orDash(active)
	if desired != "" && desired != active {
		mode += "→" + desired
	}
	return mode + " " + orDash(string(n.Status.Phase))
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// observeTimeout bounds the wait for the operator to take up a new
// ProxyConfig generation at all (status.observedGeneration).
const observeTimeout = 30 * time.Second

// WaitDone polls the rollout every 250ms until the ProxyConfig's status
// describes generation gen and is Completed or Failed, or timeout. Each
// change of the snapshot's Line is passed to onChange (when set).
func WaitDone(ctx context.Context, c client.Client, name string, gen int64, timeout time.Duration, onChange func(Snapshot)) (Snapshot, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	last := ""
	var s Snapshot
	start := time.Now()
	for {
		var err error
		s, err = Take(ctx, c, name)
		if err == nil {
			if l := s.Line(); l != last {
				last = l
				if onChange != nil {
					onChange(s)
				}
			}
			if s.Done(gen) {
				return s, nil
			}
			if s.Config.Status.ObservedGeneration < gen && time.Since(start) > observeTimeout {
				return s, fmt.Errorf("the operator did not take up ProxyConfig %s generation %d within %v (status.observedGeneration %d): is the ProxyConfig reconciler registered in cmd/operator, and is the operator running? (see its log)", name, gen, observeTimeout, s.Config.Status.ObservedGeneration)
			}
		}
		select {
		case <-ctx.Done():
			if s.Config == nil {
				return s, fmt.Errorf("ProxyConfig %s: %w (last error %v)", name, ctx.Err(), err)
			}
			return s, fmt.Errorf("ProxyConfig %s not done within %v: %s", name, timeout, s.Line())
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// Follow waits for the rollout like WaitDone and shows it through say: a
// line per change of the picture (a bar of the nodes updated, the
// rollout's phase, each node's modes and phase, and the traffic's counts
// when tr is set), and the traffic alone every 5 seconds when nothing else
// was said. It is the demos' progress view.
func Follow(ctx context.Context, c client.Client, name string, gen int64, timeout time.Duration, tr *Traffic, say func(format string, args ...any)) (Snapshot, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var lastSaid atomic.Int64
	lastSaid.Store(time.Now().UnixNano())
	quiet := func() time.Duration { return time.Duration(time.Now().UnixNano() - lastSaid.Load()) }
	if tr != nil {
		go func() {
			t := time.NewTicker(time.Second)
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
					if quiet() > 5*time.Second {
						lastSaid.Store(time.Now().UnixNano())
						say("  ... requests %d sent, %d failed", tr.Sent.Load(), tr.Failed.Load())
					}
				}
			}
		}()
	}
	return WaitDone(ctx, c, name, gen, timeout, func(s Snapshot) {
		lastSaid.Store(time.Now().UnixNano())
		st := s.Config.Status
		line := fmt.Sprintf("  %s %-11s", bar(st.Nodes.Updated, st.Nodes.Selected), orDash(string(st.Phase)))
		for _, n := range s.Nodes {
			line += fmt.Sprintf(" │ %s %-39s", n.Name, NodeText(n))
		}
		if tr != nil {
			line += fmt.Sprintf(" │ req %d fail %d", tr.Sent.Load(), tr.Failed.Load())
		}
		say("%s", line)
	})
}

// bar draws done of total nodes: [##.].
func bar(done, total int32) string {
	if total <= 0 {
		return "[   ]"
	}
	return "[" + strings.Repeat("#", int(done)) + strings.Repeat(".", int(max(0, total-done))) + "]"
}

// WaitNodesActive waits (polling, bounded by timeout) until every ProxyNode
// reports phase Active in mode: the agents have finished the switch they
// start with, so a migration starts from a settled cluster. (A ProxyConfig
// applied during that first switch once failed the rollout: the agent
// reported the first switch's end under the config's generation, so the
// operator counted the node as updated and took the next switch's
// Preparing phase for a failure. The switcher now reports a state under
// the spec it was decided from; see switcher's
// TestSpecArrivingMidSwitchIsNotAnsweredByIt.)
func WaitNodesActive(ctx context.Context, c client.Client, mode v1alpha1.ProxyMode, n int, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last string
	for {
		var l v1alpha1.ProxyNodeList
		err := c.List(ctx, &l)
		if err == nil {
			ok := len(l.Items) == n
			var states []string
			for _, pn := range l.Items {
				states = append(states, pn.Name+" "+NodeText(pn))
				if pn.Status.ActiveMode != mode || pn.Status.Phase != v1alpha1.NodeActive {
					ok = false
				}
			}
			if ok {
				return nil
			}
			slices.Sort(states)
			last = strings.Join(states, ", ")
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the ProxyNodes are not all %s Active within %v: %s (last error %v)", mode, timeout, last, err)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// Kernel is what one node's network namespace holds of proxyshift's modes.
type Kernel struct {
	// LegacyChains and NFTChains are the PROXYSHIFT-* chains in the
	// iptables-legacy and iptables-nft backends.
	LegacyChains, NFTChains []string
	// Table says whether the nftables table "proxyshift" exists.
	Table bool
}

var chainRE = regexp.MustCompile(`^:(PROXYSHIFT-[A-Za-z0-9_-]+)`)

// ReadKernel reads node n's iptables (both backends, iptables-save) and
// nftables ruleset (nft list tables) from inside its namespace.
func ReadKernel(ctx context.Context, n *cluster.Node) (Kernel, error) {
	var k Kernel
	for _, b := range []struct {
		bin string
		out *[]string
	}{{"iptables-legacy-save", &k.LegacyChains}, {"iptables-nft-save", &k.NFTChains}} {
		out, err := inNS(ctx, n, b.bin)
		if err != nil {
			return k, err
		}
		sc := bufio.NewScanner(strings.NewReader(out))
		for sc.Scan() {
			if m := chainRE.FindStringSubmatch(sc.Text()); m != nil {
				*b.out = append(*b.out, m[1])
			}
		}
	}
	out, err := inNS(ctx, n, "nft", "list", "tables")
	if err != nil {
		return k, err
	}
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if len(f) == 3 && f[0] == "table" && f[2] == "proxyshift" {
			k.Table = true
		}
	}
	return k, nil
}

// Leftovers lists what node n holds of a mode other than mode: PROXYSHIFT
// chains in either iptables backend when mode is nftables; the proxyshift
// nftables table when mode is iptables. It also fails when mode itself is
// not programmed there.
func (k Kernel) Leftovers(mode v1alpha1.ProxyMode) (leftovers []string, missing string) {
	switch mode {
	case v1alpha1.ModeNFTables:
		for _, c := range k.LegacyChains {
			leftovers = append(leftovers, "iptables-legacy chain "+c)
		}
		for _, c := range k.NFTChains {
			leftovers = append(leftovers, "iptables-nft chain "+c)
		}
		if !k.Table {
			missing = "no nftables table proxyshift"
		}
	case v1alpha1.ModeIPTables:
		if k.Table {
			leftovers = append(leftovers, "nftables table proxyshift")
		}
		if len(k.LegacyChains) == 0 && len(k.NFTChains) == 0 {
			missing = "no PROXYSHIFT-* chains in either iptables backend"
		}
	}
	return leftovers, missing
}

func inNS(ctx context.Context, n *cluster.Node, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", n.NS.Name}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s on %s: %v: %s", strings.Join(args, " "), n.Name, err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// Removal is one agent log line saying what a switch removed.
type Removal struct {
	Node, Mode, What string
	Objects          string
}

var removalRE = regexp.MustCompile(`"(Removed the old mode|Rolled back: removed the failed target|Removed kube-proxy's leftovers)".*?mode="?([a-z]+)"?.*?objects=(\[.*?\])`)

// Removals reads what the agents logged they removed (the switcher's
// "Removed the old mode" and rollback lines) from their logs, skipping
// the first skip[node] bytes of each log (pass the result of LogSizes
// taken earlier to see only what came after).
func Removals(c *cluster.Cluster, skip map[string]int64) []Removal {
	var rs []Removal
	for _, n := range c.Nodes {
		b, err := os.ReadFile(n.Agent.Log)
		if err != nil {
			continue
		}
		if off := skip[n.Name]; off > 0 && off <= int64(len(b)) {
			b = b[off:]
		}
		for _, l := range strings.Split(string(b), "\n") {
			if m := removalRE.FindStringSubmatch(l); m != nil {
				rs = append(rs, Removal{Node: n.Name, What: m[1], Mode: m[2], Objects: m[3]})
			}
		}
	}
	return rs
}

// Summary counts the removed objects by backend and kind ("iptables-nft:
// 44 chains, 6 rules"), naming them when there are few.
func (r Removal) Summary() string {
	var objs []string
	if err := json.Unmarshal([]byte(r.Objects), &objs); err != nil {
		return r.Objects
	}
	if len(objs) == 0 {
		return "nothing"
	}
	if len(objs) <= 3 {
		return strings.Join(objs, ", ")
	}
	type key struct{ backend, kind string }
	counts := map[key]int{}
	var order []key
	for _, o := range objs {
		f := strings.Fields(o)
		k := key{backend: f[0]}
		if len(f) >= 3 {
			k.kind = f[2]
		}
		if len(f) >= 2 && (f[1] == "chain" || f[1] == "rule" || f[1] == "table" || f[1] == "set" || f[1] == "service") {
			k.kind = f[1]
		}
		if counts[k] == 0 {
			order = append(order, k)
		}
		counts[k]++
	}
	var parts []string
	for _, k := range order {
		kind := k.kind
		if counts[k] != 1 {
			kind += "s"
		}
		parts = append(parts, fmt.Sprintf("%s %d %s", k.backend, counts[k], kind))
	}
	return fmt.Sprintf("%d objects: %s", len(objs), strings.Join(parts, ", "))
}

// LogSizes are the agents' log sizes now, for Removals.
func LogSizes(c *cluster.Cluster) map[string]int64 {
	m := map[string]int64{}
	for _, n := range c.Nodes {
		if fi, err := os.Stat(n.Agent.Log); err == nil {
			m[n.Name] = fi.Size()
		}
	}
	return m
}
