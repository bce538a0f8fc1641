package vmswitch_test

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	libipvs "github.com/moby/ipvs"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"

	"github.com/proxyshift/proxyshift/api/contract"
	"github.com/proxyshift/proxyshift/api/v1alpha1"
	"github.com/proxyshift/proxyshift/nodeagent/backends"
	"github.com/proxyshift/proxyshift/nodeagent/dataplane"
	"github.com/proxyshift/proxyshift/nodeagent/dataplane/iptables"
	"github.com/proxyshift/proxyshift/nodeagent/facts"
	"github.com/proxyshift/proxyshift/nodeagent/model"
	"github.com/proxyshift/proxyshift/nodeagent/nsexec"
	"github.com/proxyshift/proxyshift/nodeagent/probe"
	"github.com/proxyshift/proxyshift/nodeagent/report"
	"github.com/proxyshift/proxyshift/nodeagent/switcher"
	"github.com/proxyshift/proxyshift/test/kernelstate"
	"github.com/proxyshift/proxyshift/test/netlab"
	"github.com/proxyshift/proxyshift/test/vm"
)

var (
	// modes are the modes the node's agent has backends for.
	modes      = []v1alpha1.ProxyMode{v1alpha1.ModeNFTables, v1alpha1.ModeIPVS, v1alpha1.ModeIPTables}
	nodeConfig = dataplane.NodeConfig{
		NodeName:      "node-1",
		NodeIPs:       []netip.Addr{netlab.NodeIP},
		ClusterCIDRs:  []netip.Prefix{netlab.PodCIDR},
		MasqueradeBit: 14,
	}
	webIP    = netip.MustParseAddr("198.19.0.10")
	nodePort = netip.AddrPortFrom(netlab.NodeIP, 30080)
)

// foreign are the virtual services another program created before the
// agent started: on the node's address at a port no service has, on a
// service-range address no service has, and by firewall mark.
var foreign = []*libipvs.Service{
	{AddressFamily: unix.AF_INET, Protocol: unix.IPPROTO_TCP, Address: net.IP(netlab.NodeIP.AsSlice()), Port: 8443, SchedName: "rr"},
	{AddressFamily: unix.AF_INET, Protocol: unix.IPPROTO_UDP, Address: net.ParseIP("198.19.9.9").To4(), Port: 53, SchedName: "rr"},
	{AddressFamily: unix.AF_INET, FWMark: 77, SchedName: "rr"},
}

// TestVMSwitchIPVS moves a node nftables -> ipvs -> iptables -> ipvs ->
// nftables (every pair with ipvs, both ways) through the agent's
// switcher, under a client that keeps opening new connections to
// a cluster IP and a NodePort: none may fail, a connection opened before
// the switch to ipvs still carries data after it, and afterwards the
// kernel holds nothing of the old mode. Virtual services another program made
// before the agent started survive every switch and the final cleanup.
func TestVMSwitchIPVS(t *testing.T) {
	loadModules(t)

	lab := netlab.NewLab(t)
	pods := []*netlab.Pod{lab.Node.AddPod(t, "pod-a"), lab.Node.AddPod(t, "pod-b")}
	h, err := libipvs.New(fmt.Sprintf("/proc/self/fd/%d", lab.Node.NS.FD()))
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	for _, s := range foreign {
		if err := h.NewService(s); err != nil {
			t.Fatalf("create a foreign virtual service: %v", err)
		}
	}
	foreignDump := ipvsServices(t, h)

	n := startNode(t, lab, nodeConfig, web(podIPs(pods)), v1alpha1.ModeNFTables)
	n.waitActive(v1alpha1.ModeNFTables)
	requireTraffic(t, lab, len(pods))
	n.requireOnly(v1alpha1.ModeNFTables)

	from := v1alpha1.ModeNFTables
	for _, to := range []v1alpha1.ProxyMode{v1alpha1.ModeIPVS, v1alpha1.ModeIPTables, v1alpha1.ModeIPVS, v1alpha1.ModeNFTables} {
		t.Run(string(from)+"-to-"+string(to), func(t *testing.T) {
			// Long-lived connections, opened before the switch, to the
			// cluster IP and the NodePort: whichever mode forwarded them,
			// they carry data after it (conntrack's NAT, or the IPVS
			// backend's handover of its connections to it).
			var sessions []*netlab.Session
			for _, target := range []netip.AddrPort{netip.AddrPortFrom(webIP, 80), nodePort} {
				session, err := lab.Client.NS.OpenSession(target, 2*time.Second)
				if err != nil {
					t.Fatalf("open a long-lived connection to %s: %v", target, err)
				}
				defer session.Close()
				sessions = append(sessions, session)
			}
			// And one that keeps exchanging data all through the switch.
			busy, err := lab.Client.NS.OpenSession(netip.AddrPortFrom(webIP, 80), 2*time.Second)
			if err != nil {
				t.Fatalf("open a busy connection: %v", err)
			}
			defer busy.Close()
			loop := netlab.StartClientLoop(t, lab.Client.NS, netip.AddrPortFrom(webIP, 80), nodePort)
			stopChatter := chatter(busy)
			time.Sleep(300 * time.Millisecond)

			n.sw.SetDesire(switcher.Desire{Mode: to})
			n.waitActive(to)
			time.Sleep(300 * time.Millisecond)
			loop.RequireNoFailures(t, "during the switch")
			if exchanged, err := stopChatter(); err != nil {
				t.Errorf("the connection opened through %s (to %s) that kept exchanging data through the switch failed after %d exchanges: %v", from, busy.Server, exchanged, err)
			} else {
				t.Logf("the busy connection (to %s) exchanged data %d times through the switch", busy.Server, exchanged)
			}
			for i, session := range sessions {
				for j := range 3 {
					if err := session.Exchange(fmt.Sprintf("after-switch-%d", j), 2*time.Second); err != nil {
						t.Errorf("connection %d, opened through %s before the switch (to %s), no longer carries data: %v", i, from, session.Server, err)
						break
					}
				}
			}
			n.requireOnly(to)
			requireTraffic(t, lab, len(pods))
			if got := foreignOf(ipvsServices(t, h)); got != foreignDump {
				t.Errorf("after the switch to %s the foreign virtual services are\n%s\nwant\n%s", to, got, foreignDump)
			}
		})
		from = to
	}

	// Uninstall: the serving mode's objects go, the foreign ones stay.
	n.stop()
	for m := range n.fanout.Keys() {
		if _, err := n.fanout.Remove(m).Cleanup(context.Background()); err != nil {
			t.Errorf("clean up %s: %v", m, err)
		}
	}
	n.requireOnly("")
	if got := ipvsServices(t, h); got != foreignDump {
		t.Errorf("after cleanup the kernel holds the virtual services\n%s\nwant only the foreign ones\n%s", got, foreignDump)
	}
}

// loadModules loads, in the VM (and skips the test elsewhere), what the
// agent's preflight loads for every mode, the tables of both iptables
// variants, which the VM's kernel cannot load on demand (it has no
// /sbin/modprobe), and the lab's bridges and veth pairs.
func loadModules(t *testing.T) {
	t.Helper()
	vm.Require(t, "IPVS (the ip_vs kernel module)")
	mods := []string{"bridge", "veth"}
	for _, m := range modes {
		l, err := contract.ModulesFor(m, "")
		if err != nil {
			t.Fatal(err)
		}
		mods = append(mods, l...)
	}
	for _, v := range []iptables.Variant{iptables.Legacy, iptables.NFT} {
		l, err := contract.IPTablesBackendModules(string(v))
		if err != nil {
			t.Fatal(err)
		}
		mods = append(mods, l...)
	}
	vm.LoadModules(t, mods...)
}

// web is the service the tests reach: a cluster IP and a NodePort, the
// pods as endpoints.
func web(pods []netip.Addr) *model.Snapshot {
	sp := &model.ServicePort{
		Name:      model.ServicePortName{Namespace: "lab", Name: "web", Port: "http", Protocol: corev1.ProtocolTCP},
		Family:    corev1.IPv4Protocol,
		ClusterIP: webIP, Protocol: corev1.ProtocolTCP, Port: 80, NodePort: int32(nodePort.Port()),
	}
	for _, ip := range pods {
		sp.Endpoints = append(sp.Endpoints, model.Endpoint{IP: ip, Port: netlab.ServerPort, Ready: true, Serving: true, IsLocal: true})
	}
	return &model.Snapshot{Ports: map[corev1.IPFamily]map[model.ServicePortName]*model.ServicePort{
		corev1.IPv4Protocol: {sp.Name: sp},
	}}
}

// node is the agent's switching machinery for the lab node, in-process:
// the switcher with its Fanout, the backends the agent builds, its
// preflight and its prober, and a reporter that keeps the phases.
type node struct {
	t      *testing.T
	lab    *netlab.Lab
	fanout *switcher.Fanout
	sw     *switcher.Switcher
	rep    *phases
	// seen is how many states were reported when the last switch ended.
	seen int
	stop func()
}

// startNode builds the switcher for mode, with backends for the node cfg
// describes, syncs snap into the Fanout (the sync loop's first sync) and
// runs the switcher until the test ends.
func startNode(t *testing.T, lab *netlab.Lab, cfg dataplane.NodeConfig, snap *model.Snapshot, mode v1alpha1.ProxyMode) *node {
	t.Helper()
	ns := lab.Node.NS.NS()
	n := &node{t: t, lab: lab, fanout: switcher.NewFanout(), rep: &phases{}}
	n.sw = switcher.New(agentConfig(ns, cfg, n.fanout, n.rep), switcher.Desire{Mode: mode})
	ctx, cancel := context.WithCancel(context.Background())
	st, step, err := n.sw.Init(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := n.fanout.Sync(ctx, dataplane.SyncRequest{Model: snap, Full: true}); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := n.sw.Run(ctx, st, step); err != nil {
			t.Errorf("switcher: %v", err)
		}
	}()
	var once sync.Once
	n.stop = func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(n.stop)
	return n
}

// agentConfig is the switcher's configuration as the agent builds it, for
// the node namespace ns and the node cfg describes.
func agentConfig(ns nsexec.NS, cfg dataplane.NodeConfig, fanout *switcher.Fanout, rep switcher.Reporter) switcher.Config {
	return switcher.Config{
		Fanout:  fanout,
		Backend: func(m v1alpha1.ProxyMode) (dataplane.Backend, string, error) { return newBackend(ns, cfg, m) },
		Modes:   modes,
		Prepare: &facts.Gatherer{NS: ns},
		Prober:  &probe.Prober{NS: ns, Attempts: 2},
		NodeIPs: func() []netip.Addr { return cfg.NodeIPs },
		Report:  rep,
	}
}

// newBackend builds mode's backend for the node namespace ns, as cfg
// describes the node, with the agent's factories.
func newBackend(ns nsexec.NS, cfg dataplane.NodeConfig, mode v1alpha1.ProxyMode) (dataplane.Backend, string, error) {
	f, ok := backends.Factories(backends.Env{NS: ns})[mode]
	if !ok {
		return nil, "", fmt.Errorf("mode %s is not in this test", mode)
	}
	b, err := f(cfg, v1alpha1.ProxySettings{})
	return b, "", err
}

// phases is the switcher's reporter: it keeps every switch state
// reported.
type phases struct {
	mu   sync.Mutex
	seen []report.Switch
}

func (p *phases) SetSwitch(s report.Switch) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.seen = append(p.seen, s)
}

func (p *phases) Flush(context.Context) error { return nil }

// since returns the last state reported and the phases reported from the
// i-th on, and how many were reported in all.
func (p *phases) since(i int) (report.Switch, []v1alpha1.NodePhase, int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var walked []v1alpha1.NodePhase
	for _, s := range p.seen[i:] {
		walked = append(walked, s.Phase)
	}
	if len(p.seen) == 0 {
		return report.Switch{}, nil, 0
	}
	return p.seen[len(p.seen)-1], walked, len(p.seen)
}

// switchTimeout bounds one switch.
const switchTimeout = 3 * time.Minute

// waitActive waits until mode serves, and fails the test at once if the
// switch fails. It fails the test unless the switch walked every phase in
// order, reported once each.
func (n *node) waitActive(mode v1alpha1.ProxyMode) {
	n.t.Helper()
	n.waitServing(mode, []v1alpha1.NodePhase{v1alpha1.NodePreparing, v1alpha1.NodeProgramming, v1alpha1.NodeVerifying, v1alpha1.NodeCleaningUp, v1alpha1.NodeActive})
}

// waitServing waits until mode serves, and fails the test at once if the
// switch fails, or if want is set and the phases reported on the way
// are not want.
func (n *node) waitServing(mode v1alpha1.ProxyMode, want []v1alpha1.NodePhase) {
	n.t.Helper()
	// Generous: under emulation on a busy host, the dual-stack switch
	// ipvs -> iptables (both families, both iptables variants read and
	// swept) took 130 s in one run, where 60 s had been the bound.
	deadline := time.Now().Add(switchTimeout)
	for {
		s, walked, seen := n.rep.since(n.seen)
		switch {
		case s.Phase == v1alpha1.NodeActive && s.Active == mode:
			n.seen = seen
			if want != nil && !slices.Equal(walked, want) {
				n.t.Errorf("the switch to %s reported the phases %v, want %v", mode, walked, want)
			}
			return
		case s.Phase == v1alpha1.NodeFailed:
			n.t.Fatalf("the switch to %s failed: %s: %s", mode, s.Reason, s.Message)
		case time.Now().After(deadline):
			n.t.Fatalf("%s not active within %v; last state %+v, phases %v", mode, switchTimeout, s, walked)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// requireOnly fails unless the kernel holds the objects of mode and none
// of the other modes' ("" for none at all), as kernelstate reads them;
// for ipvs, a virtual service on the web service's address.
func (n *node) requireOnly(mode v1alpha1.ProxyMode) {
	n.t.Helper()
	st, err := kernelstate.Read(n.lab.Node.NS)
	if err != nil {
		n.t.Fatal(err)
	}
	for _, d := range st.Only(mode, webIP) {
		n.t.Errorf("%s:\n%s", d, st)
	}
}

// ipvsServices renders the virtual services h sees, one per line, sorted.
func ipvsServices(t *testing.T, h *libipvs.Handle) string {
	t.Helper()
	dump, err := kernelstate.VirtualServices(h)
	if err != nil {
		t.Fatal(err)
	}
	return dump
}

// foreignOf keeps the lines of an ipvsServices dump that are foreign
// virtual services.
func foreignOf(dump string) string {
	var keep []string
	for _, l := range strings.Split(dump, "\n") {
		if strings.Contains(l, ":8443 ") || strings.Contains(l, " 198.19.9.9:") || strings.Contains(l, "fwmark 77 ") {
			keep = append(keep, l)
		}
	}
	return strings.Join(keep, "\n")
}

func podIPs(pods []*netlab.Pod) []netip.Addr {
	var out []netip.Addr
	for _, p := range pods {
		out = append(out, p.IP)
	}
	return out
}

// requireTraffic checks that every pod answers through the cluster IP
// and the NodePort.
func requireTraffic(t *testing.T, lab *netlab.Lab, pods int) {
	t.Helper()
	requireAnswers(t, lab, pods, netip.AddrPortFrom(webIP, 80), nodePort)
}

// requireAnswers fails unless every connection from the lab's client to
// each target is answered, by all pods.
func requireAnswers(t *testing.T, lab *netlab.Lab, pods int, targets ...netip.AddrPort) {
	t.Helper()
	for _, target := range targets {
		if tally := lab.Client.NS.Spread(netlab.TCP, target, 20, 2*time.Second); len(tally.Answers) != pods || tally.Answered() != 20 {
			t.Errorf("%s: %v; want every connection answered, by all %d pods", target, tally, pods)
		}
	}
}

// chatter exchanges data on session, one message every 10 ms, until the
// returned function is called; that returns how many exchanges succeeded
// and the first failure, after which chatter stops.
//
// An exchange may take a while: leaving ipvs, the handover drops the
// connection's packets until IPVS has expired its entry, up to 3 s
// (handoverWait; in the emulated VM under a loaded host the removal took
// 4.3 s once, which a 5-second exchange did not survive), and TCP then
// sends again only on its backoff (0.2, 0.4, 0.8, 1.6, 3.2 s): a 3-second
// drop costs an exchange up to about 6 s.
func chatter(session *netlab.Session) func() (int, error) {
	stop := make(chan struct{})
	done := make(chan struct{})
	var n int
	var failure error
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
			if err := session.Exchange(fmt.Sprintf("busy-%d", n), 12*time.Second); err != nil {
				failure = err
				return
			}
			n++
		}
	}()
	return func() (int, error) {
		close(stop)
		<-done
		return n, failure
	}
}
