package ipvs

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	dt "github.com/proxyshift/proxyshift/nodeagent/dataplane/dataplanetest"
	"github.com/proxyshift/proxyshift/nodeagent/model"
)

// describePlan renders a plan as one line per step, in apply's order.
func describePlan(p *plan) string {
	var lines []string
	if p.replace {
		lines = append(lines, fmt.Sprintf("replace table with %d elements", len(p.elems)))
	}
	for _, e := range p.preDel {
		lines = append(lines, "pre delete "+e.id())
	}
	for _, e := range p.add {
		lines = append(lines, "add "+e.id())
	}
	for _, vs := range p.create {
		lines = append(lines, fmt.Sprintf("create %s with %d real servers", vs.key, len(vs.dests)))
	}
	for _, u := range p.update {
		if u.attrs {
			lines = append(lines, fmt.Sprintf("update %s", u.want.key))
		}
		for _, d := range u.add {
			lines = append(lines, fmt.Sprintf("add real server %s to %s weight %d", d, u.want.key, u.want.dests[d]))
		}
		for _, d := range u.set {
			lines = append(lines, fmt.Sprintf("set real server %s of %s weight %d", d, u.want.key, u.want.dests[d]))
		}
		for _, d := range u.del {
			lines = append(lines, fmt.Sprintf("delete real server %s of %s", d, u.want.key))
		}
	}
	for _, a := range p.bind {
		lines = append(lines, "bind "+a.String())
	}
	for _, a := range p.unbind {
		lines = append(lines, "unbind "+a.String())
	}
	for _, k := range p.remove {
		lines = append(lines, "remove "+k.String())
	}
	for _, e := range p.postDel {
		lines = append(lines, "post delete "+e.id())
	}
	return strings.Join(lines, "\n")
}

// baseModel is three services of every shape the incremental tests touch.
func baseModel() map[model.ServicePortName]*model.ServicePort {
	return dt.PortsOf(
		dt.Svc("default", "web", "http", "10.96.0.10", 80, dt.NodePort(30080), dt.EP("10.244.1.2", 8080), dt.EP("10.244.2.3", 8080)),
		dt.Svc("default", "api", "http", "10.96.0.20", 80, dt.LB("198.18.100.1"), dt.SourceRanges("203.0.113.0/24"), dt.EP("10.244.1.4", 8080)),
		dt.Svc("default", "dns", "dns", "10.96.0.53", 53, dt.UDP, dt.ExternalIPs("198.18.50.5"), dt.EP("10.244.1.9", 53)),
	)
}

// nameOf finds the port of the service called name in any of models.
func nameOf(name string, models ...map[model.ServicePortName]*model.ServicePort) model.ServicePortName {
	for _, ports := range models {
		for n := range ports {
			if n.Name == name {
				return n
			}
		}
	}
	panic("no port " + name)
}

// incremental plans an incremental sync of changed from base to next and
// returns the plan and the state after it.
func incremental(t *testing.T, base, next map[model.ServicePortName]*model.ServicePort, changed ...string) (*plan, *familyState) {
	t.Helper()
	st, _ := newState(testRenderConfig(ipv4, testConfig), base, nil)
	cs := model.ChangeSet{}
	for _, c := range changed {
		cs[nameOf(c, base, next)] = struct{}{}
	}
	changes, conflicts := changesFor(st, next, cs)
	if len(conflicts) > 0 {
		t.Fatalf("conflicts: %v", conflicts)
	}
	p := incrementalPlan(st, changes)
	st.commit(changes)
	return p, st
}

func TestIncrementalOneEndpointChange(t *testing.T) {
	base := baseModel()
	next := baseModel()
	web := nameOf("web", next)
	next[web] = dt.Svc("default", "web", "http", "10.96.0.10", 80, dt.NodePort(30080), dt.EP("10.244.1.2", 8080), dt.EP("10.244.3.7", 8080))
	p, _ := incremental(t, base, next, "web")
	want := strings.Join([]string{
		"add hairpin: 10.244.3.7 . 10.244.3.7",
		"add real server 10.244.3.7:8080 to tcp/10.96.0.10:80 weight 1",
		"delete real server 10.244.2.3:8080 of tcp/10.96.0.10:80",
		"add real server 10.244.3.7:8080 to tcp/192.168.1.10:30080 weight 1",
		"delete real server 10.244.2.3:8080 of tcp/192.168.1.10:30080",
		"post delete hairpin: 10.244.2.3 . 10.244.2.3",
	}, "\n")
	if got := describePlan(p); got != want {
		t.Errorf("plan:\n%s\nwant:\n%s", got, want)
	}
}

func TestIncrementalUnchangedPortTouchesNothing(t *testing.T) {
	p, _ := incremental(t, baseModel(), baseModel(), "web", "api", "dns")
	if !p.empty() {
		t.Errorf("rewriting unchanged ports plans work:\n%s", describePlan(p))
	}
}

func TestIncrementalDeleteService(t *testing.T) {
	base := baseModel()
	next := baseModel()
	delete(next, nameOf("api", next))
	p, st := incremental(t, base, next, "api")
	want := strings.Join([]string{
		"unbind 10.96.0.20",
		"unbind 198.18.100.1",
		"remove tcp/10.96.0.20:80",
		"remove tcp/198.18.100.1:80",
		"post delete firewall-allowed: 198.18.100.1 . tcp . 80 . 203.0.113.0/24",
		"post delete firewall: 198.18.100.1 . tcp . 80",
		"post delete hairpin: 10.244.1.4 . 10.244.1.4",
		"post delete service-ips: 10.96.0.20",
		"post delete service-ips: 198.18.100.1",
		"post delete verdicts-from-node: 10.96.0.20 . tcp . 80 : jump mark-for-masquerade",
		"post delete verdicts-from-node: 198.18.100.1 . tcp . 80 : jump mark-for-masquerade",
		"post delete verdicts-from-others: 10.96.0.20 . tcp . 80 : jump mark-for-masquerade",
		"post delete verdicts-from-others: 198.18.100.1 . tcp . 80 : jump mark-for-masquerade",
		"post delete verdicts-from-pods: 198.18.100.1 . tcp . 80 : jump mark-for-masquerade",
		`post delete virtual-services: 10.96.0.20 . tcp . 80 comment "default/api:http/TCP"`,
		`post delete virtual-services: 198.18.100.1 . tcp . 80 comment "default/api:http/TCP"`,
	}, "\n")
	if got := describePlan(p); got != want {
		t.Errorf("plan:\n%s\nwant:\n%s", got, want)
	}
	fresh, _ := newState(testRenderConfig(ipv4, testConfig), next, nil)
	if dumpState(st) != dumpState(fresh) {
		t.Errorf("state after the change:\n%s\nrendered from scratch:\n%s", dumpState(st), dumpState(fresh))
	}
}

func TestIncrementalEndpointsGone(t *testing.T) {
	base := baseModel()
	next := baseModel()
	dns := nameOf("dns", next)
	next[dns] = dt.Svc("default", "dns", "dns", "10.96.0.53", 53, dt.UDP, dt.ExternalIPs("198.18.50.5"))
	p, _ := incremental(t, base, next, "dns")
	want := strings.Join([]string{
		// The masquerading elements go with the endpoints, before the
		// real servers; reject comes in at once.
		"pre delete verdicts-from-node: 10.96.0.53 . udp . 53 : jump mark-for-masquerade",
		"pre delete verdicts-from-node: 198.18.50.5 . udp . 53 : jump mark-for-masquerade",
		"pre delete verdicts-from-others: 10.96.0.53 . udp . 53 : jump mark-for-masquerade",
		"pre delete verdicts-from-others: 198.18.50.5 . udp . 53 : jump mark-for-masquerade",
		"pre delete verdicts-from-pods: 198.18.50.5 . udp . 53 : jump mark-for-masquerade",
		"add no-endpoint: 10.96.0.53 . udp . 53 : goto reject",
		"add no-endpoint: 198.18.50.5 . udp . 53 : goto reject",
		"delete real server 10.244.1.9:53 of udp/10.96.0.53:53",
		"delete real server 10.244.1.9:53 of udp/198.18.50.5:53",
		"post delete hairpin: 10.244.1.9 . 10.244.1.9",
	}, "\n")
	if got := describePlan(p); got != want {
		t.Errorf("plan:\n%s\nwant:\n%s", got, want)
	}
}

func TestIncrementalTerminatingEndpointDrains(t *testing.T) {
	base := baseModel()
	next := baseModel()
	web := nameOf("web", next)
	next[web] = dt.Svc("default", "web", "http", "10.96.0.10", 80, dt.NodePort(30080), dt.EP("10.244.1.2", 8080), dt.EP("10.244.2.3", 8080, dt.Terminating))
	p, _ := incremental(t, base, next, "web")
	want := strings.Join([]string{
		"set real server 10.244.2.3:8080 of tcp/10.96.0.10:80 weight 0",
		"set real server 10.244.2.3:8080 of tcp/192.168.1.10:30080 weight 0",
	}, "\n")
	if got := describePlan(p); got != want {
		t.Errorf("plan:\n%s\nwant:\n%s", got, want)
	}
}

func TestIncrementalAffinityUpdatesTheService(t *testing.T) {
	base := baseModel()
	next := baseModel()
	dns := nameOf("dns", next)
	next[dns].AffinityTimeout = 600e9
	p, _ := incremental(t, base, next, "dns")
	if got, want := describePlan(p), "update udp/10.96.0.53:53\nupdate udp/198.18.50.5:53"; got != want {
		t.Errorf("plan:\n%s\nwant:\n%s", got, want)
	}
}

// TestIncrementalKeepsUnchangedClaims checks that a changed port cannot
// take a virtual service an unchanged port holds, and that a key moving
// between two changed ports is updated in place.
func TestIncrementalKeepsUnchangedClaims(t *testing.T) {
	base := baseModel()
	next := baseModel()
	// "zz" wants api's load-balancer IP and port; api keeps it.
	zz := dt.Svc("default", "zz", "http", "10.96.0.99", 80, dt.ExternalIPs("198.18.100.1"), dt.EP("10.244.1.50", 8080))
	next[zz.Name] = zz
	st, _ := newState(testRenderConfig(ipv4, testConfig), base, nil)
	changes, _ := changesFor(st, next, model.ChangeSet{zz.Name: {}})
	p := incrementalPlan(st, changes)
	for _, vs := range p.create {
		if vs.key.String() == "tcp/198.18.100.1:80" {
			t.Errorf("the new port took a key an unchanged port holds:\n%s", describePlan(p))
		}
	}
	if !slices.Contains(p.bind, netip.MustParseAddr("10.96.0.99")) || slices.Contains(p.bind, netip.MustParseAddr("198.18.100.1")) {
		t.Errorf("binds %v; want the new cluster IP only (the shared address is bound already)", p.bind)
	}

	// api goes and zz changes in the same sync: zz takes the key, which
	// becomes an update of the existing virtual service.
	delete(next, nameOf("api", next))
	p, _ = incremental(t, base, next, "api", "zz")
	desc := describePlan(p)
	for _, want := range []string{
		"add real server 10.244.1.50:8080 to tcp/198.18.100.1:80 weight 1",
		"delete real server 10.244.1.4:8080 of tcp/198.18.100.1:80",
		`pre delete virtual-services: 198.18.100.1 . tcp . 80 comment "default/api:http/TCP"`,
		`add virtual-services: 198.18.100.1 . tcp . 80 comment "default/zz:http/TCP"`,
	} {
		if !strings.Contains(desc, want) {
			t.Errorf("plan lacks %q:\n%s", want, desc)
		}
	}
	if strings.Contains(desc, "remove tcp/198.18.100.1:80") || strings.Contains(desc, "unbind 198.18.100.1") {
		t.Errorf("the moved virtual service is deleted:\n%s", desc)
	}
}

func TestForeignConflict(t *testing.T) {
	foreign := map[vsKey]bool{{addr: netip.MustParseAddr("192.168.1.10"), proto: 6, port: 30080}: true}
	st, conflicts := newState(testRenderConfig(ipv4, testConfig), baseModel(), foreign)
	if len(conflicts) != 1 || conflicts[0].String() != "tcp/192.168.1.10:30080" {
		t.Errorf("conflicts %v; want tcp/192.168.1.10:30080", conflicts)
	}
	for k := range st.services() {
		if foreign[k] {
			t.Errorf("the state programs the foreign virtual service %s", k)
		}
	}
	for _, e := range st.elements() {
		if foreign[e.owner] {
			t.Errorf("the state holds element %s of the foreign virtual service", e.id())
		}
	}
}

func TestFullPlan(t *testing.T) {
	st, _ := newState(testRenderConfig(ipv4, testConfig), baseModel(), nil)
	kv := &kernelView{services: st.services(), addrs: dt.Addrs("10.96.0.10", "10.96.0.20", "10.96.0.53", "198.18.100.1", "198.18.50.5")}
	p := fullPlan(st, kv)
	if len(p.create)+len(p.update)+len(p.remove)+len(p.bind)+len(p.unbind)+len(p.postDel) > 0 {
		t.Errorf("the kernel holds the state, yet the full plan changes it:\n%s", describePlan(p))
	}

	// Drift: a real server gone, a weight changed, one of ours left over
	// (a service deleted while the agent was down), an address missing
	// and a stray one bound.
	kv = &kernelView{services: map[vsKey]*virtualService{}, addrs: dt.Addrs("10.96.0.10", "10.96.0.20", "10.96.0.53", "198.18.100.1", "10.96.7.7")}
	for k, vs := range st.services() {
		c := *vs
		c.dests = map[netip.AddrPort]int{}
		for d, w := range vs.dests {
			c.dests[d] = w
		}
		kv.services[k] = &c
	}
	web := vsKey{addr: netip.MustParseAddr("10.96.0.10"), proto: 6, port: 80}
	delete(kv.services[web].dests, netip.MustParseAddrPort("10.244.2.3:8080"))
	kv.services[web].dests[netip.MustParseAddrPort("10.244.1.2:8080")] = 0
	stale := vsKey{addr: netip.MustParseAddr("10.96.7.7"), proto: 6, port: 443}
	kv.services[stale] = &virtualService{key: stale, scheduler: "rr"}
	want := strings.Join([]string{
		"replace table with 33 elements",
		"add real server 10.244.2.3:8080 to tcp/10.96.0.10:80 weight 1",
		"set real server 10.244.1.2:8080 of tcp/10.96.0.10:80 weight 1",
		"bind 198.18.50.5",
		"unbind 10.96.7.7",
		"remove tcp/10.96.7.7:443",
		"post delete virtual-services: 10.96.7.7 . tcp . 443",
	}, "\n")
	if got := describePlan(fullPlan(st, kv)); got != want {
		t.Errorf("plan:\n%s\nwant:\n%s", got, want)
	}
}

func TestDiffServices(t *testing.T) {
	k := func(s string) vsKey {
		ap := netip.MustParseAddrPort(s)
		return vsKey{addr: ap.Addr(), proto: 6, port: ap.Port()}
	}
	d := func(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }
	have := map[vsKey]*virtualService{
		k("10.0.0.1:80"): {key: k("10.0.0.1:80"), scheduler: "rr", dests: map[netip.AddrPort]int{d("10.1.0.1:80"): 1}},
		k("10.0.0.2:80"): {key: k("10.0.0.2:80"), scheduler: "rr"},
	}
	want := map[vsKey]*virtualService{
		k("10.0.0.1:80"): {key: k("10.0.0.1:80"), scheduler: "wrr", dests: map[netip.AddrPort]int{d("10.1.0.1:80"): 1}},
		k("10.0.0.3:80"): {key: k("10.0.0.3:80"), scheduler: "rr", dests: map[netip.AddrPort]int{d("10.1.0.3:80"): 1}},
	}
	create, update, remove := diffServices(have, want)
	if len(create) != 1 || create[0].key != k("10.0.0.3:80") {
		t.Errorf("create %v", create)
	}
	if len(update) != 1 || !update[0].attrs || len(update[0].add)+len(update[0].set)+len(update[0].del) != 0 {
		t.Errorf("update %+v; want the scheduler of 10.0.0.1:80 only", update)
	}
	if len(remove) != 1 || remove[0] != k("10.0.0.2:80") {
		t.Errorf("remove %v", remove)
	}
}

// TestCounts checks that the counts a sync reports are
// those Programmed reads back: one per virtual service, real server,
// element and rule, and the service ports and endpoints by record.
func TestCounts(t *testing.T) {
	st, _ := newState(testRenderConfig(ipv4, testConfig), baseModel(), nil)
	c := st.counts()
	if c.Services != 3 || c.Endpoints != 4 {
		t.Errorf("counts %+v; want 3 services and 4 endpoints", c)
	}
	rules := 0
	for _, ch := range st.chains {
		rules += len(ch.Rules)
	}
	services := st.services()
	dests := 0
	for _, vs := range services {
		dests += len(vs.dests)
	}
	if want := rules + len(st.elements()) + len(fixedElements()) + len(services) + dests; c.Rules != want {
		t.Errorf("rules %d, want %d", c.Rules, want)
	}
}
