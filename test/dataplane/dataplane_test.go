package dataplane_test

import (
	"fmt"
	"io"
	"net/netip"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/proxyshift/proxyshift/nodeagent/dataplane"
	"github.com/proxyshift/proxyshift/nodeagent/dataplane/iptables"
	"github.com/proxyshift/proxyshift/nodeagent/model"
	"github.com/proxyshift/proxyshift/test/netlab"
	"github.com/proxyshift/proxyshift/test/vm"
)

// backend is one row of the suite: a dataplane and how to drive it.
type backend struct {
	name string
	// skip calls t.Skip, naming what is missing (a binary, a kernel
	// feature), when the backend cannot run in node; else it returns.
	skip func(t *testing.T, node *netlab.NetNS)
	// new creates the backend programming node's namespace. It must leave
	// what is programmed as it is until the first Sync (the restart check
	// relies on that) and registers with t.Cleanup whatever the object
	// holds (netlink sockets and the like).
	new func(t *testing.T, node *netlab.NetNS, cfg dataplane.NodeConfig) dataplane.Backend
	// drift damages what the backend programmed in node for family fam,
	// by hand, the way an administrator or another program might.
	drift func(t *testing.T, node *netlab.NetNS, fam ipFamily)
	// dump renders what the backend programmed in node as the kernel
	// reports it; every failing check logs it.
	dump func(node *netlab.NetNS) string
	// affinityLinger is how much longer than a ClientIP affinity timeout
	// the backend may still send a client to the endpoint it had, counted
	// from the client's last new connection, when the client ends every
	// connection with a reset (netlab's RequestReset).
	affinityLinger time.Duration
}

// backends are the rows of the suite. Adding a dataplane is adding a row.
// skipHostRowInVM skips, inside the test VM, a row the host's kernel runs
// already in make test: under emulation the VM's time goes to what only
// it can run (the ipvs rows; SCTP, whose test keeps every row there).
// TestDataplane keeps every row in the VM, which shows the lab and the
// other backends work on Debian's stock kernel too.
func skipHostRowInVM(t *testing.T, row backend) {
	t.Helper()
	if vm.Inside() && row.name != "ipvs" {
		t.Skipf("the %s row runs on the host's kernel (make test); in the VM only the ipvs row of this test runs", row.name)
	}
}

var backends = []backend{
	{
		name:  "nftables",
		skip:  skipWithoutNFTables,
		new:   newNFTables,
		drift: nftDeleteTable,
		dump:  nftDump,
	},
	iptablesRow(iptables.NFT),
	iptablesRow(iptables.Legacy),
	{name: "ipvs", skip: skipWithoutIPVS, new: newIPVS, drift: ipvsDrift, dump: ipvsDump, affinityLinger: ipvsAffinityLinger},
}

const (
	// requests is how many requests a load-balancing check makes; with
	// three endpoints the chance that a working random balancer misses
	// one is below 1e-10.
	requests = 60
	// okTimeout bounds a request that should be answered.
	okTimeout = 2 * time.Second
	// failTimeout bounds a request that should not be answered; a
	// rejected one must fail well within it.
	failTimeout = 500 * time.Millisecond
	// briefAffinity is the ClientIP affinity timeout of service brief:
	// timeoutSeconds 2, near the API's minimum of 1 so that the check of
	// its expiry is quick, and long enough for a burst of requests.
	briefAffinity = 2 * time.Second
	// affinityRounds bounds the rounds of the session-affinity-timeout
	// check; see there.
	affinityRounds = 10
)

var (
	nodeConfig = dataplane.NodeConfig{
		NodeName:      "node-1",
		NodeIPs:       []netip.Addr{netlab.NodeIP},
		ClusterCIDRs:  []netip.Prefix{netlab.PodCIDR},
		MasqueradeBit: 14,
	}
	// The services' addresses, from netlab.ServiceCIDR.
	webIP       = netip.MustParseAddr("198.19.0.10")
	stickyIP    = netip.MustParseAddr("198.19.0.11")
	dnsIP       = netip.MustParseAddr("198.19.0.12")
	nodePortIP  = netip.MustParseAddr("198.19.0.13")
	lbClusterIP = netip.MustParseAddr("198.19.0.14")
	externalIP  = netip.MustParseAddr("198.19.1.14")
	lbIP        = netip.MustParseAddr("198.19.2.14")
	emptyIP     = netip.MustParseAddr("198.19.0.15")
	localIP     = netip.MustParseAddr("198.19.0.16")
	noLocalIP   = netip.MustParseAddr("198.19.0.17")
	churnIP     = netip.MustParseAddr("198.19.0.18")
	briefIP     = netip.MustParseAddr("198.19.0.19")
	victimIP    = netip.MustParseAddr("198.19.0.20")
	hijackerIP  = netip.MustParseAddr("198.19.0.21")
	hijackerExt = netip.MustParseAddr("198.19.1.21")
)

// sshPort is a port of the node itself, which a Service's externalIP on
// the node's address must not take.
const sshPort = 22

const (
	nodePort        = 30080
	localNodePort   = 30086
	noLocalNodePort = 30087
)

// pods are the lab's pods: a, b and c run on this node; d stands for a pod
// on another node (it is on the same bridge, so a backend that wrongly
// sends it local-only traffic gets an answer from it and is caught).
type pods struct{ a, b, c, d *netlab.Pod }

// services builds the suite's service ports in family fam.
func services(p pods, fam ipFamily) map[model.ServicePortName]*model.ServicePort {
	svc := func(name string, proto corev1.Protocol, ip netip.Addr, port int32, eps ...*netlab.Pod) *model.ServicePort {
		sp := &model.ServicePort{
			Name:      model.ServicePortName{Namespace: "suite", Name: name, Port: "p", Protocol: proto},
			Family:    fam.model,
			ClusterIP: fam.addr(ip),
			Protocol:  proto,
			Port:      port,
		}
		for _, pod := range eps {
			sp.Endpoints = append(sp.Endpoints, endpoint(fam, pod, pod != p.d))
		}
		return sp
	}
	sticky := svc("sticky", corev1.ProtocolTCP, stickyIP, 80, p.a, p.b, p.c)
	sticky.AffinityTimeout = 3 * time.Hour
	brief := svc("brief", corev1.ProtocolTCP, briefIP, 80, p.a, p.b, p.c)
	brief.AffinityTimeout = briefAffinity
	np := svc("nodeport", corev1.ProtocolTCP, nodePortIP, 80, p.a, p.b)
	np.NodePort = nodePort
	lb := svc("lb", corev1.ProtocolTCP, lbClusterIP, 80, p.a, p.b)
	lb.ExternalIPs = []netip.Addr{fam.addr(externalIP)}
	lb.LoadBalancerIPs = []netip.Addr{fam.addr(lbIP)}
	lb.LoadBalancerSourceRanges = []netip.Prefix{fam.prefix(netip.PrefixFrom(netlab.ClientIP, 32))}
	local := svc("local", corev1.ProtocolTCP, localIP, 80, p.a, p.d)
	local.NodePort = localNodePort
	local.ExternalPolicyLocal = true
	noLocal := svc("nolocal", corev1.ProtocolTCP, noLocalIP, 80, p.d)
	noLocal.NodePort = noLocalNodePort
	noLocal.ExternalPolicyLocal = true

	out := map[model.ServicePortName]*model.ServicePort{}
	for _, sp := range []*model.ServicePort{
		svc("web", corev1.ProtocolTCP, webIP, 80, p.a, p.b, p.c),
		sticky,
		brief,
		svc("dns", corev1.ProtocolUDP, dnsIP, 53, p.a, p.b, p.c),
		np,
		lb,
		svc("empty", corev1.ProtocolTCP, emptyIP, 80),
		svc("empty", corev1.ProtocolUDP, emptyIP, 53),
		local,
		noLocal,
		svc("churn", corev1.ProtocolTCP, churnIP, 80, p.a, p.b, p.c),
	} {
		out[sp.Name] = sp
	}
	for name, sp := range claimed(p, fam) {
		out[name] = sp
	}
	return out
}

// claimed builds, through the model's Tracker as the agent does, a
// Service "victim" and a Service "hijacker" whose externalIPs name the
// victim's cluster IP and the node's own address, next to an address of
// its own. Only that last one may reach the hijacker's pod (pod-d): the
// victim's cluster IP stays the victim's, the node's address the node's.
// Without the model's claims the hijacker, first in name order, would win
// both.
func claimed(p pods, fam ipFamily) map[model.ServicePortName]*model.ServicePort {
	tr := model.NewTracker("node-1", nil)
	tr.SetNodeAddrs([]netip.Addr{fam.addr(netlab.NodeIP)})
	add := func(name string, clusterIP netip.Addr, ports []int32, pod *netlab.Pod, ext ...netip.Addr) {
		clusterIP = fam.addr(clusterIP)
		svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "suite", Name: name}, Spec: corev1.ServiceSpec{
			ClusterIP: clusterIP.String(), ClusterIPs: []string{clusterIP.String()}, IPFamilies: []corev1.IPFamily{fam.model},
		}}
		for _, e := range ext {
			svc.Spec.ExternalIPs = append(svc.Spec.ExternalIPs, fam.addr(e).String())
		}
		slice := &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Namespace: "suite", Name: name + "-1", Labels: map[string]string{discoveryv1.LabelServiceName: name}},
			AddressType: discoveryv1.AddressType(fam.model),
			Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{fam.addr(pod.IP).String()}, NodeName: new("node-1")}},
		}
		for _, port := range ports {
			pname := fmt.Sprint("p", port)
			svc.Spec.Ports = append(svc.Spec.Ports, corev1.ServicePort{Name: pname, Port: port, Protocol: corev1.ProtocolTCP})
			slice.Ports = append(slice.Ports, discoveryv1.EndpointPort{Name: new(pname), Port: new(int32(netlab.ServerPort)), Protocol: new(corev1.ProtocolTCP)})
		}
		tr.OnServiceAdd(svc)
		tr.OnEndpointSliceAdd(model.SliceOf(slice))
	}
	add("victim", victimIP, []int32{80}, p.a)
	add("hijacker", hijackerIP, []int32{80, sshPort}, p.d, victimIP, netlab.NodeIP, hijackerExt)
	snap, _ := tr.Snapshot()
	return snap.Ports[fam.model]
}

// endpoint is pod p as an endpoint in family fam, on this node if local.
func endpoint(fam ipFamily, p *netlab.Pod, local bool) model.Endpoint {
	return model.Endpoint{IP: fam.addr(p.IP), Port: netlab.ServerPort, Ready: true, Serving: true, IsLocal: local}
}

// snapshot is a model holding ports, in their family (that of any of
// them; the suite's are all of one).
func snapshot(ports map[model.ServicePortName]*model.ServicePort) *model.Snapshot {
	family := corev1.IPv4Protocol
	for _, sp := range ports {
		family = sp.Family
		break
	}
	return &model.Snapshot{Ports: map[corev1.IPFamily]map[model.ServicePortName]*model.ServicePort{family: ports}}
}

func TestDataplane(t *testing.T) {
	netlab.RequireRoot(t)
	for _, row := range backends {
		t.Run(row.name, func(t *testing.T) { runSuite(t, row, ipv4) })
	}
}

// runSuite runs every check against one backend, in one lab, with
// services and traffic of family fam. The checks run in order and share
// the programmed state; the last three (restart, drift, cleanup) change
// it on purpose.
func runSuite(t *testing.T, row backend, fam ipFamily) {
	lab := netlab.NewLab(t)
	node := lab.Node
	row.skip(t, node.NS)
	p := pods{a: node.AddPod(t, "pod-a"), b: node.AddPod(t, "pod-b"), c: node.AddPod(t, "pod-c"), d: node.AddPod(t, "pod-d")}
	ports := services(p, fam)
	cfg := fam.nodeConfig()
	ctx := t.Context()

	// check runs one check as a subtest and, if it fails, logs what the
	// backend has programmed at that moment.
	check := func(name string, fn func(t *testing.T)) {
		t.Run(name, func(t *testing.T) {
			defer func() {
				if t.Failed() {
					t.Logf("%s state in the node namespace:\n%s", row.name, row.dump(node.NS))
				}
			}()
			fn(t)
		})
	}

	b := row.new(t, node.NS, cfg)
	if _, err := b.Sync(ctx, dataplane.SyncRequest{Model: snapshot(ports), Full: true}); err != nil {
		t.Fatalf("first full sync: %v\n%s", err, row.dump(node.NS))
	}
	programmed, err := b.Programmed(ctx)
	if err != nil {
		t.Fatalf("programmed after the first sync: %v", err)
	}
	t.Logf("programmed: %+v", programmed)
	if programmed.Services != len(ports) {
		t.Errorf("programmed %d services, want %d", programmed.Services, len(ports))
	}

	client, other := lab.Client.NS, lab.OtherClient.NS
	all := []string{"pod-a", "pod-b", "pod-c"}
	// svcAddr is a suite address (as written, IPv4) and port in fam.
	svcAddr := func(ip netip.Addr, port int) netip.AddrPort { return netip.AddrPortFrom(fam.addr(ip), uint16(port)) }
	web := svcAddr(webIP, 80)

	check("cluster-ip", func(t *testing.T) {
		expectSpread(t, client, netlab.TCP, web, all)
	})
	check("hairpin", func(t *testing.T) {
		// A pod reaching its own Service and landing on itself is
		// answered: without masquerading, its reply would go straight
		// back to itself, from its own address instead of the Service's,
		// and the connection would fail. Each endpoint, pod-a among
		// them, answers pod-a.
		expectSpread(t, p.a.NS, netlab.TCP, web, all)
	})
	check("session-affinity", func(t *testing.T) {
		tally := client.Spread(netlab.TCP, svcAddr(stickyIP, 80), requests, okTimeout)
		if tally.Answered() != requests || len(tally.Answers) != 1 {
			t.Errorf("%d requests with ClientIP affinity: %v; want all answered by one pod", requests, tally)
		}
	})
	check("session-affinity-timeout", func(t *testing.T) {
		expectAffinityExpires(t, client, svcAddr(briefIP, 80), briefAffinity+row.affinityLinger)
	})
	check("udp-cluster-ip", func(t *testing.T) {
		expectSpread(t, client, netlab.UDP, svcAddr(dnsIP, 53), all)
	})
	check("node-port", func(t *testing.T) {
		expectSpread(t, client, netlab.TCP, svcAddr(netlab.NodeIP, nodePort), []string{"pod-a", "pod-b"})
	})
	check("external-ip", func(t *testing.T) {
		// Source ranges guard load-balancer IPs only, as in kube-proxy:
		// the external IP answers every client.
		expectSpread(t, client, netlab.TCP, svcAddr(externalIP, 80), []string{"pod-a", "pod-b"})
		expectSpread(t, other, netlab.TCP, svcAddr(externalIP, 80), []string{"pod-a", "pod-b"})
	})
	check("load-balancer-source-ranges", func(t *testing.T) {
		lb := svcAddr(lbIP, 80)
		expectSpread(t, client, netlab.TCP, lb, []string{"pod-a", "pod-b"})
		if got, err := other.Request(netlab.TCP, lb, failTimeout); err == nil {
			t.Errorf("client %s outside the source ranges reached %s: answered by %s", fam.addr(netlab.OtherClientIP), lb, got)
		} else {
			t.Logf("client outside the source ranges: %v", err)
		}
	})
	check("service-ips-not-yours", func(t *testing.T) {
		// The victim's cluster IP answers from the victim's pod only, the
		// node's port 22 from the node itself; the hijacker keeps the
		// external address that is its own.
		self, err := netlab.StartServer(node.NS, "node-itself", sshPort)
		if err != nil {
			t.Fatal(err)
		}
		defer self.Stop()
		expectSpread(t, client, netlab.TCP, svcAddr(victimIP, 80), []string{"pod-a"})
		expectSpread(t, client, netlab.TCP, svcAddr(netlab.NodeIP, sshPort), []string{"node-itself"})
		expectSpread(t, client, netlab.TCP, svcAddr(hijackerExt, sshPort), []string{"pod-d"})
		expectSpread(t, client, netlab.TCP, svcAddr(hijackerIP, 80), []string{"pod-d"})
	})
	check("no-endpoints-rejects", func(t *testing.T) {
		expectRefused(t, client, netlab.TCP, svcAddr(emptyIP, 80))
		expectRefused(t, client, netlab.UDP, svcAddr(emptyIP, 53))
	})
	check("external-traffic-policy-local", func(t *testing.T) {
		// Only the local endpoint answers on the node port; the cluster
		// IP still uses every endpoint.
		expectSpread(t, client, netlab.TCP, svcAddr(netlab.NodeIP, localNodePort), []string{"pod-a"})
		expectSpread(t, client, netlab.TCP, svcAddr(localIP, 80), []string{"pod-a", "pod-d"})
		// No local endpoint: external traffic is dropped, not sent away.
		got, err := client.Request(netlab.TCP, svcAddr(netlab.NodeIP, noLocalNodePort), failTimeout)
		if err == nil {
			t.Errorf("node port without local endpoints answered by %s; want dropped", got)
		} else if netlab.KindOf(err) != netlab.Timeout {
			t.Errorf("node port without local endpoints: %v; want dropped (timeout)", err)
		}
	})
	check("endpoint-removed-and-restored", func(t *testing.T) {
		churn := svcAddr(churnIP, 80)
		name := model.ServicePortName{Namespace: "suite", Name: "churn", Port: "p", Protocol: corev1.ProtocolTCP}
		changed := model.ChangeSet{name: {}}
		sp := ports[name]
		full := sp.Endpoints
		t.Cleanup(func() { sp.Endpoints = full })

		sp.Endpoints = []model.Endpoint{endpoint(fam, p.a, true), endpoint(fam, p.c, true)}
		if _, err := b.Sync(ctx, dataplane.SyncRequest{Model: snapshot(ports), Changed: changed}); err != nil {
			t.Fatalf("sync without pod-b: %v", err)
		}
		expectSpread(t, client, netlab.TCP, churn, []string{"pod-a", "pod-c"})

		sp.Endpoints = full
		if _, err := b.Sync(ctx, dataplane.SyncRequest{Model: snapshot(ports), Changed: changed}); err != nil {
			t.Fatalf("sync with pod-b back: %v", err)
		}
		expectSpread(t, client, netlab.TCP, churn, all)
		expectSpread(t, client, netlab.TCP, web, all)
	})
	check("restart", func(t *testing.T) {
		before, err := b.Programmed(ctx)
		if err != nil {
			t.Fatal(err)
		}
		session, err := client.OpenSession(web, okTimeout)
		if err != nil {
			t.Fatalf("open a connection to %s: %v", web, err)
		}
		defer session.Close()

		// The agent goes away: its object is dropped, the kernel keeps the rules.
		if c, ok := b.(io.Closer); ok {
			if err := c.Close(); err != nil {
				t.Errorf("close the old backend: %v", err)
			}
		}
		b = row.new(t, node.NS, cfg)
		expectSpread(t, client, netlab.TCP, web, all)
		if got, err := b.Programmed(ctx); err != nil || got != before {
			t.Errorf("new backend before its first sync reads %+v, %v; the old one programmed %+v", got, err, before)
		}

		if _, err := b.Sync(ctx, dataplane.SyncRequest{Model: snapshot(ports), Full: true}); err != nil {
			t.Fatalf("full sync after the restart: %v", err)
		}
		if got, err := b.Programmed(ctx); err != nil || got != before {
			t.Errorf("after the full sync: %+v, %v; before the restart %+v", got, err, before)
		}
		expectSpread(t, client, netlab.TCP, web, all)
		if err := session.Exchange("after-restart", okTimeout); err != nil {
			t.Errorf("connection opened before the restart: %v", err)
		}
	})
	check("drift", func(t *testing.T) {
		before, err := b.Programmed(ctx)
		if err != nil {
			t.Fatal(err)
		}
		row.drift(t, node.NS, fam)
		damaged, progErr := b.Programmed(ctx)
		_, reqErr := client.Request(netlab.TCP, web, failTimeout)
		t.Logf("after drift: programmed %+v (err %v), request to %s: %v", damaged, progErr, web, reqErr)
		if progErr == nil && damaged == before && reqErr == nil {
			t.Fatalf("drift changed nothing visible: programmed %+v as before and %s still answers", damaged, web)
		}

		if _, err := b.Sync(ctx, dataplane.SyncRequest{Model: snapshot(ports), Full: true}); err != nil {
			t.Fatalf("full sync to repair the drift: %v", err)
		}
		if got, err := b.Programmed(ctx); err != nil || got != before {
			t.Errorf("after the repair: %+v, %v; before the drift %+v", got, err, before)
		}
		expectSpread(t, client, netlab.TCP, web, all)
		expectSpread(t, client, netlab.TCP, svcAddr(netlab.NodeIP, nodePort), []string{"pod-a", "pod-b"})
	})
	check("cleanup", func(t *testing.T) {
		removed, err := b.Cleanup(ctx)
		if err != nil {
			t.Fatalf("cleanup: %v", err)
		}
		t.Logf("cleanup removed %d objects: %q", len(removed), removed)
		if len(removed) == 0 {
			t.Error("cleanup reports it removed nothing")
		}
		if got, err := b.Programmed(ctx); err != nil || got != (dataplane.Counts{}) {
			t.Errorf("programmed after cleanup: %+v, %v; want zero", got, err)
		}
		for _, addr := range []netip.AddrPort{web, svcAddr(netlab.NodeIP, nodePort), svcAddr(externalIP, 80)} {
			if got, err := client.Request(netlab.TCP, addr, failTimeout); err == nil {
				t.Errorf("%s still answered by %s after cleanup", addr, got)
			}
		}
		if got, err := client.Request(netlab.UDP, svcAddr(dnsIP, 53), failTimeout); err == nil {
			t.Errorf("UDP %s still answered by %s after cleanup", svcAddr(dnsIP, 53), got)
		}
	})
}

// expectSpread makes requests to addr from ns and checks that every one
// is answered and that exactly the pods in want answered.
func expectSpread(t *testing.T, ns *netlab.NetNS, proto netlab.Proto, addr netip.AddrPort, want []string) {
	t.Helper()
	tally := ns.Spread(proto, addr, requests, okTimeout)
	if tally.Answered() != requests || !slices.Equal(tally.Names(), want) {
		t.Errorf("%d %s requests from %s to %s: %v; want all answered by exactly %v",
			requests, proto, ns.Name, addr, tally, want)
	}
}

// expectAffinityExpires checks ClientIP affinity with a short timeout at
// addr from ns, whose affinity is gone at the latest release after the
// client's last new connection. Each round makes a burst of requests,
// with a pause of half the timeout (briefAffinity) in the middle, that
// must all be answered by one pod: stickiness within the timeout. Then
// the client stays silent for release plus a second and the next round
// starts: its first connection is a fresh load-balancing decision.
//
// Release shows as a round answered by another pod than the round before.
// Requests after the silence cannot show it as a spread within one round:
// the first of them makes a new affinity that holds all the others. With
// the three endpoints of brief and a working release, a round lands on
// the previous round's pod with probability 1/3 (random choice; IPVS's
// round-robin moves on for sure), so affinityRounds = 10 rounds without
// a change happen with probability (1/3)^10 < 2e-5. Without release
// every round is answered by the same pod and the check fails.
func expectAffinityExpires(t *testing.T, ns *netlab.NetNS, addr netip.AddrPort, release time.Duration) {
	t.Helper()
	const burst = 10
	var pods []string
	for round := range affinityRounds {
		if round > 0 {
			time.Sleep(release + time.Second)
		}
		answers := map[string]int{}
		for i := range burst {
			if i == burst/2 {
				time.Sleep(briefAffinity / 2)
			}
			got, err := ns.RequestReset(addr, okTimeout)
			if err != nil {
				t.Fatalf("round %d, request %d to %s: %v", round, i, addr, err)
			}
			answers[got]++
		}
		if len(answers) != 1 {
			t.Fatalf("round %d: %d requests to %s within its affinity timeout %v answered by %v; want one pod",
				round, burst, addr, briefAffinity, answers)
		}
		for pod := range answers {
			pods = append(pods, pod)
		}
		if round > 0 && pods[round] != pods[round-1] {
			t.Logf("affinity released after %v of silence: pods by round %v", release+time.Second, pods)
			return
		}
	}
	t.Errorf("%d rounds to %s, each after %v of silence, all answered by %s; want the affinity (timeout %v) released",
		affinityRounds, addr, release+time.Second, pods[0], briefAffinity)
}

// expectRefused checks that a request to addr is refused at once: a
// reject, not a drop (timeout) nor an answer.
func expectRefused(t *testing.T, ns *netlab.NetNS, proto netlab.Proto, addr netip.AddrPort) {
	t.Helper()
	start := time.Now()
	got, err := ns.Request(proto, addr, okTimeout)
	elapsed := time.Since(start)
	switch {
	case err == nil:
		t.Errorf("%s %s answered by %s; want refused", proto, addr, got)
	case netlab.KindOf(err) != netlab.Refused:
		t.Errorf("%s %s: %v; want refused", proto, addr, err)
	case elapsed > okTimeout/4:
		t.Errorf("%s %s refused only after %v; want at once", proto, addr, elapsed)
	}
}
