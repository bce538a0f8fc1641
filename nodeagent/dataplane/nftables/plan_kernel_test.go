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

// ruleHandles lists every rule of our tables of family f, as
// "table chain#handle": a rule added by a sync gets a new handle.
func ruleHandles(t *testing.T, conn *nftables.Conn, f *family) []string {
	t.Helper()
	chains, err := conn.ListChainsOfTableFamily(f.Table)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, c := range chains {
		if !slices.Contains(TableNames(), c.Table.Name) {
			continue
		}
		rules, err := conn.GetRules(c.Table, c)
		if err != nil {
			t.Fatalf("rules of %s: %v", c.Name, err)
		}
		for _, r := range rules {
			out = append(out, viewKey(c.Table.Name, c.Name)+"#"+itoa(int32(r.Handle)))
		}
	}
	slices.Sort(out)
	return out
}

// TestKernelEndpointChangeReplacesOneRule: endpoint changes of a service
// without ClientIP affinity (replace, add, remove, down to one, back)
// replace its DNAT rule, in its service table, and leave every other
// rule of every table as it was (same handles): the only table the
// kernel validates again is that service table.
func TestKernelEndpointChangeReplacesOneRule(t *testing.T) {
	ns, conn := kernelNS(t)
	b := newBackend(t, ns)
	m := testModel()
	mustSync(t, b, dataplane.SyncRequest{Model: m, Full: true})
	v4 := m.Ports[corev1.IPv4Protocol]
	web := model.ServicePortName{Namespace: "default", Name: "web", Port: "http", Protocol: corev1.ProtocolTCP}
	dnat := viewKey(serviceTableName(namesFor(web).table), namesFor(web).service) + "#"
	others := func() []string {
		return slices.DeleteFunc(ruleHandles(t, conn, ipv4), func(h string) bool { return strings.HasPrefix(h, dnat) })
	}
	before, rule := others(), ""
	for _, eps := range [][]dt.PortOpt{
		{dt.EP("10.244.1.2", 8080), dt.EP("10.244.2.3", 8080), dt.EP("10.244.3.99", 8080)},
		{dt.EP("10.244.1.2", 8080), dt.EP("10.244.2.3", 8080), dt.EP("10.244.3.99", 8080), dt.EP("10.244.4.1", 8080, dt.Local)},
		{dt.EP("10.244.4.1", 9090, dt.Terminating)},
		{dt.EP("10.244.1.2", 8080), dt.EP("10.244.2.3", 8080), dt.EP("10.244.3.4", 8080)},
	} {
		v4[web] = dt.Svc("default", "web", "http", "10.96.0.10", 80, eps...)
		mustSync(t, b, dataplane.SyncRequest{Model: m, Changed: model.ChangeSet{web: {}}})
		assertProgrammed(t, ns, conn, m, b)
		if after := others(); !slices.Equal(after, before) {
			t.Errorf("rules changed with the endpoints of %s:\nbefore %v\nafter  %v", web, before, after)
		}
		i := slices.IndexFunc(ruleHandles(t, conn, ipv4), func(h string) bool { return strings.HasPrefix(h, dnat) })
		if i < 0 {
			t.Fatalf("no DNAT rule of %s", web)
		}
		if now := ruleHandles(t, conn, ipv4)[i]; now == rule {
			t.Errorf("the DNAT rule of %s kept its handle %s through an endpoint change", web, now)
		} else {
			rule = now
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

// TestKernelPortsInTheirServiceTables: each port's DNAT chain is in the
// service table its name picks, and nowhere else, after full and
// incremental syncs.
func TestKernelPortsInTheirServiceTables(t *testing.T) {
	ns, conn := kernelNS(t)
	b := newBackend(t, ns)
	v4 := dt.ManyPorts(40, 2)
	m := &model.Snapshot{Ports: map[corev1.IPFamily]map[model.ServicePortName]*model.ServicePort{corev1.IPv4Protocol: v4, corev1.IPv6Protocol: {}}}
	check := func(when string) {
		t.Helper()
		assertProgrammed(t, ns, conn, m, b)
		v, _ := kernelView(t, ns, conn, ipv4)
		used := map[int]bool{}
		for name := range v4 {
			n := namesFor(name)
			used[n.table] = true
			for i := range serviceTables {
				_, in := v.chains[viewKey(serviceTableName(i), n.service)]
				if in != (i == n.table) {
					t.Errorf("%s: chain %s in table %s: %v", when, n.service, serviceTableName(i), in)
				}
			}
		}
		if len(v4) == 40 && len(used) < serviceTables/2 {
			t.Errorf("%s: 40 ports in %d service tables", when, len(used))
		}
	}
	mustSync(t, b, dataplane.SyncRequest{Model: m, Full: true})
	check("full sync")
	changed := model.ChangeSet{}
	for _, name := range model.SortedNames(v4)[30:] {
		delete(v4, name)
		changed[name] = struct{}{}
	}
	for i := range 5 {
		sp := dt.Svc("new", fmt.Sprintf("svc-%d", i), "http", fmt.Sprintf("10.97.0.%d", i), 80, dt.EP(fmt.Sprintf("10.244.9.%d", i), 80))
		v4[sp.Name] = sp
		changed[sp.Name] = struct{}{}
	}
	mustSync(t, b, dataplane.SyncRequest{Model: m, Changed: changed})
	check("incremental sync")
}

// TestKernelAffinityToggles: a port that gains ClientIP affinity moves
// from a DNAT rule's anonymous map to endpoint chains, and back.
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
