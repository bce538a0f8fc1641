package nftables

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	corev1 "k8s.io/api/core/v1"

	"github.com/proxyshift/proxyshift/nodeagent/dataplane"
	dt "github.com/proxyshift/proxyshift/nodeagent/dataplane/dataplanetest"
	"github.com/proxyshift/proxyshift/nodeagent/model"
	"github.com/proxyshift/proxyshift/test/netlab"
)

// ruleHandles lists every rule of our table of family f, by chain, as
// "chain#handle": a rule added by a sync gets a new handle.
func ruleHandles(t *testing.T, conn *nftables.Conn, f *family) []string {
	t.Helper()
	table := &nftables.Table{Name: TableName, Family: f.Table}
	chains, err := conn.ListChainsOfTableFamily(f.Table)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, c := range chains {
		if c.Table.Name != TableName {
			continue
		}
		rules, err := conn.GetRules(table, c)
		if err != nil {
			t.Fatalf("rules of %s: %v", c.Name, err)
		}
		for _, r := range rules {
			out = append(out, c.Name+"#"+itoa(int32(r.Handle)))
		}
	}
	slices.Sort(out)
	return out
}

// TestKernelEndpointChangeAddsNoRule: endpoint changes of a service
// without ClientIP affinity (replace, add, remove, down to one, back)
// leave every rule of the table as it was (same handles): only the
// port's endpoint map and the hairpin set change, so the kernel has no
// reason to re-validate the table.
func TestKernelEndpointChangeAddsNoRule(t *testing.T) {
	ns, conn := kernelNS(t)
	b := newBackend(t, ns)
	m := testModel()
	mustSync(t, b, dataplane.SyncRequest{Model: m, Full: true})
	before := ruleHandles(t, conn, ipv4)

	v4 := m.Ports[corev1.IPv4Protocol]
	web := model.ServicePortName{Namespace: "default", Name: "web", Port: "http", Protocol: corev1.ProtocolTCP}
	for _, eps := range [][]dt.PortOpt{
		{dt.EP("10.244.1.2", 8080), dt.EP("10.244.2.3", 8080), dt.EP("10.244.3.99", 8080)},
		{dt.EP("10.244.1.2", 8080), dt.EP("10.244.2.3", 8080), dt.EP("10.244.3.99", 8080), dt.EP("10.244.4.1", 8080, dt.Local)},
		{dt.EP("10.244.4.1", 9090, dt.Terminating)},
		{dt.EP("10.244.1.2", 8080), dt.EP("10.244.2.3", 8080), dt.EP("10.244.3.4", 8080)},
	} {
		v4[web] = dt.Svc("default", "web", "http", "10.96.0.10", 80, eps...)
		mustSync(t, b, dataplane.SyncRequest{Model: m, Changed: model.ChangeSet{web: {}}})
		assertProgrammed(t, ns, conn, m, b)
		if after := ruleHandles(t, conn, ipv4); !slices.Equal(after, before) {
			t.Errorf("rules changed with the endpoints of %s:\nbefore %v\nafter  %v", web, before, after)
		}
	}
}

// TestKernelHairpin sends real packets: a pod reaching a service whose
// only endpoint is itself gets an answer, because the connection is
// masqueraded (the pod would otherwise drop a packet from its own
// address); without the pod's hairpin element it gets none.
func TestKernelHairpin(t *testing.T) {
	netlab.RequireRoot(t)
	lab := netlab.NewLab(t)
	pod := lab.Node.AddPod(t, "pod-a")
	syncOneService(t, lab, labNodeConfig, "self", pod.IP)
	addr := netip.AddrPortFrom(serviceIP, 80)
	if got, err := pod.NS.Request(netlab.TCP, addr, 2*time.Second); err != nil || got != "pod-a" {
		t.Fatalf("pod-a to its own service: %q, %v; want an answer from pod-a", got, err)
	}

	// The same without the hairpin element: no answer.
	conn, err := nftables.New(nftables.WithNetNSFd(lab.Node.NS.FD()))
	if err != nil {
		t.Fatal(err)
	}
	hp := &nftables.Set{Name: setHairpin, Table: &nftables.Table{Name: TableName, Family: nftables.TableFamilyIPv4},
		KeyType: nftables.MustConcatSetType(nftables.TypeIPAddr, nftables.TypeIPAddr)}
	key := append(pod.IP.AsSlice(), pod.IP.AsSlice()...)
	if err := conn.SetDeleteElements(hp, []nftables.SetElement{{Key: key}}); err != nil {
		t.Fatal(err)
	}
	if err := conn.Flush(); err != nil {
		t.Fatal(err)
	}
	if got, err := pod.NS.Request(netlab.TCP, addr, 500*time.Millisecond); err == nil {
		t.Errorf("without the hairpin element, pod-a to its own service answered by %q; the test proves nothing", got)
	}
}

// TestKernelEndpointMapsComeAndGo: incremental syncs create a
// service-endpoints map when its first port appears and delete it when
// its last port goes; a full sync numbers the ports afresh.
func TestKernelEndpointMapsComeAndGo(t *testing.T) {
	ns, conn := kernelNS(t)
	b := newBackend(t, ns)
	v4 := dt.ManyPorts(20, 2) // ids 1-20: maps 0 and 1
	m := &model.Snapshot{Ports: map[corev1.IPFamily]map[model.ServicePortName]*model.ServicePort{corev1.IPv4Protocol: v4, corev1.IPv6Protocol: {}}}
	mustSync(t, b, dataplane.SyncRequest{Model: m, Full: true})
	assertProgrammed(t, ns, conn, m, b)
	mapsNow := func() []string {
		v, _ := kernelView(t, ns, conn, ipv4)
		var names []string
		for name := range v.sets {
			if strings.HasPrefix(name, prefixEndpointMap) {
				names = append(names, name)
			}
		}
		slices.Sort(names)
		return names
	}
	if got := mapsNow(); !slices.Equal(got, []string{"service-endpoints-0", "service-endpoints-1"}) {
		t.Fatalf("endpoint maps %v", got)
	}

	// The ports numbered 16-20 go: map 1 goes with them.
	changed := model.ChangeSet{}
	for _, name := range model.SortedNames(v4)[15:] {
		delete(v4, name)
		changed[name] = struct{}{}
	}
	mustSync(t, b, dataplane.SyncRequest{Model: m, Changed: changed})
	assertProgrammed(t, ns, conn, m, b)
	if got := mapsNow(); !slices.Equal(got, []string{"service-endpoints-0"}) {
		t.Errorf("endpoint maps after deleting ports 16-20: %v", got)
	}

	// 20 new ports get ids 21-40: maps 1 and 2 appear.
	changed = model.ChangeSet{}
	for i := range 20 {
		sp := dt.Svc("new", fmt.Sprintf("svc-%d", i), "http", fmt.Sprintf("10.97.0.%d", i), 80, dt.EP(fmt.Sprintf("10.244.9.%d", i), 80))
		v4[sp.Name] = sp
		changed[sp.Name] = struct{}{}
	}
	mustSync(t, b, dataplane.SyncRequest{Model: m, Changed: changed})
	assertProgrammed(t, ns, conn, m, b)
	if got := mapsNow(); !slices.Equal(got, []string{"service-endpoints-0", "service-endpoints-1", "service-endpoints-2"}) {
		t.Errorf("endpoint maps after adding 20 ports: %v", got)
	}

	// A full sync numbers the 35 ports 1-35 again.
	mustSync(t, b, dataplane.SyncRequest{Model: m, Full: true})
	assertProgrammed(t, ns, conn, m, b)
	if got := mapsNow(); !slices.Equal(got, []string{"service-endpoints-0", "service-endpoints-1", "service-endpoints-2"}) {
		t.Errorf("endpoint maps after a full sync: %v", got)
	}
}

// TestKernelAffinityToggles: a port that gains ClientIP affinity moves
// from the service-endpoints map to endpoint chains, and back.
func TestKernelAffinityToggles(t *testing.T) {
	ns, conn := kernelNS(t)
	b := newBackend(t, ns)
	m := testModel()
	mustSync(t, b, dataplane.SyncRequest{Model: m, Full: true})
	v4 := m.Ports[corev1.IPv4Protocol]
	web := model.ServicePortName{Namespace: "default", Name: "web", Port: "http", Protocol: corev1.ProtocolTCP}
	plain := v4[web]
	sticky := *plain
	sticky.AffinityTimeout = time.Hour
	for _, sp := range []*model.ServicePort{&sticky, plain} {
		v4[web] = sp
		mustSync(t, b, dataplane.SyncRequest{Model: m, Changed: model.ChangeSet{web: {}}})
		assertProgrammed(t, ns, conn, m, b)
		if len(b.stale[ipv4]) != 0 {
			t.Errorf("stale chains left: %v", b.stale[ipv4])
		}
	}
}
