package nftables

import (
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"

	"github.com/proxyshift/proxyshift/nodeagent/dataplane"
	dt "github.com/proxyshift/proxyshift/nodeagent/dataplane/dataplanetest"
	"github.com/proxyshift/proxyshift/nodeagent/model"
)

// stateOf is the backend's memory after a full sync of ports.
func stateOf(ports map[model.ServicePortName]*model.ServicePort, np *dataplane.NodePolicy) *familyState {
	ts, claims := render(ipv4, ports, np)
	return &familyState{ts: ts, claims: claims}
}

// withPort returns ports with sp replacing (or adding) its name.
func withPort(ports map[model.ServicePortName]*model.ServicePort, sp *model.ServicePort) map[model.ServicePortName]*model.ServicePort {
	out := maps.Clone(ports)
	out[sp.Name] = sp
	return out
}

// planned is the incremental plan of every table of st, flattened: ops[i]
// is for the table named tables[i].
type planned struct {
	ops     []op
	tables  []string
	stale   []string
	changes [][]portChange
}

// planIncremental plans, as Backend.incremental does, the sync of the
// changed ports of ports.
func planIncremental(st *familyState, ports map[model.ServicePortName]*model.ServicePort, changed model.ChangeSet, np *dataplane.NodePolicy) planned {
	var p planned
	p.changes, _ = planChanges(ipv4, st, ports, changed, np)
	for i, rs := range st.ts {
		ops, stale := incrementalPlan(p.changes[i], rs.counted)
		p.ops = append(p.ops, ops...)
		for range ops {
			p.tables = append(p.tables, rs.name)
		}
		p.stale = append(p.stale, stale...)
	}
	return p
}

// apply does to st what Backend.incremental does after a commit of p.
func (p planned) apply(st *familyState) {
	for i, rs := range st.ts {
		for _, ch := range p.changes[i] {
			rs.counted.add(ch.old, -1)
			if ch.new == nil {
				delete(rs.ports, ch.name)
				continue
			}
			rs.counted.add(ch.new, 1)
			rs.ports[ch.name] = ch.new
		}
	}
}

func opStrings(ops []op) []string {
	s := make([]string, len(ops))
	for i, o := range ops {
		s[i] = o.String()
	}
	return s
}

func TestIncrementalEndpointChangeTouchesOnlyItsPort(t *testing.T) {
	np := newNodePolicy(ipv4, testConfig)
	ports := dt.ManyPorts(200, 3)
	st := stateOf(ports, np)

	// Service 17 replaces its last endpoint (10.128.0.17:8002) with a new
	// one on another port.
	target := model.ServicePortName{Namespace: "ns", Name: "svc-17", Port: "http", Protocol: "TCP"}
	changed := dt.Svc("ns", "svc-17", "http", "10.96.0.17", 80,
		dt.EP("10.128.0.17", 8000), dt.EP("10.128.0.17", 8001), dt.EP("10.128.0.17", 9000))
	p := planIncremental(st, withPort(ports, changed), model.ChangeSet{target: {}}, np)

	// The port's DNAT rule is replaced, in its service table only.
	n := namesFor(target)
	want := []string{
		"flush chain " + n.service,
		"add rule " + n.service + " meta l4proto tcp dnat ip to numgen random mod 3 map { 0 : 10.128.0.17 . 8000, 1 : 10.128.0.17 . 8001, 2 : 10.128.0.17 . 9000 }",
	}
	if got := opStrings(p.ops); !slices.Equal(got, want) {
		t.Errorf("plan:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	for _, table := range p.tables {
		if table != serviceTableName(n.table) {
			t.Errorf("plan writes table %s, want only %s", table, serviceTableName(n.table))
		}
	}
	if len(p.stale) != 0 {
		t.Errorf("stale chains %v, want none", p.stale)
	}
}

// TestEndpointChangesStayInTheirTable checks the claim the layout rests
// on: for a service without affinity, an endpoint change (add, remove,
// replace, all gone but one) replaces its DNAT rule and writes nothing
// else, in its service table, whose validation is all the kernel does
// for it (but for the hairpin set of the main table, when an endpoint of
// this node comes or goes).
func TestEndpointChangesStayInTheirTable(t *testing.T) {
	np := newNodePolicy(ipv4, testConfig)
	ports := dt.ManyPorts(20, 3)
	st := stateOf(ports, np)
	target := model.ServicePortName{Namespace: "ns", Name: "svc-7", Port: "http", Protocol: "TCP"}
	table := serviceTableName(namesFor(target).table)
	for _, eps := range [][]dt.PortOpt{
		{dt.EP("10.128.0.7", 8000), dt.EP("10.128.0.7", 8001), dt.EP("10.128.0.7", 8002), dt.EP("10.128.9.9", 80)},
		{dt.EP("10.128.0.7", 8000)},
		{dt.EP("10.128.5.5", 8000, dt.Terminating)},
		{dt.EP("10.128.0.7", 8000), dt.EP("10.128.6.6", 8000, dt.Local)},
	} {
		p := planIncremental(st, withPort(ports, dt.Svc("ns", "svc-7", "http", "10.96.0.7", 80, eps...)), model.ChangeSet{target: {}}, np)
		if len(p.ops) == 0 {
			t.Errorf("no ops for a changed port")
		}
		for i, o := range p.ops {
			switch {
			case p.tables[i] == TableName && o.name == setHairpin:
			case p.tables[i] != table:
				t.Errorf("endpoint change writes table %s: %s", p.tables[i], o)
			case o.kind != opFlushChain && o.kind != opAddRule:
				t.Errorf("endpoint change: %s", o)
			}
		}
	}
}

func TestHairpinRefCounts(t *testing.T) {
	np := newNodePolicy(ipv4, testConfig)
	// Two services share endpoint address 10.244.1.2 (on two ports). An
	// endpoint on another node (10.244.9.9) cannot hairpin through this
	// node's rules and has no pair.
	a := dt.Svc("ns", "a", "http", "10.96.0.1", 80, dt.EP("10.244.1.2", 80, dt.Local), dt.EP("10.244.1.3", 80, dt.Local), dt.EP("10.244.9.9", 80))
	b := dt.Svc("ns", "b", "http", "10.96.0.2", 80, dt.EP("10.244.1.2", 81, dt.Local))
	st := stateOf(dt.PortsOf(a, b), np)
	counts := func(st *familyState) refCounts { return st.ts.main().counted[setHairpin] }
	if want := (refCounts{"10.244.1.2 . 10.244.1.2": 2, "10.244.1.3 . 10.244.1.3": 1}); !maps.Equal(counts(st), want) {
		t.Fatalf("hairpin counts %v, want %v", counts(st), want)
	}
	step := func(next *model.ServicePort, wantOps ...string) {
		t.Helper()
		ports := dt.PortsOf(a, b)
		ports[next.Name] = next
		p := planIncremental(st, ports, model.ChangeSet{next.Name: {}}, np)
		var got []string
		for _, o := range p.ops {
			if o.name == setHairpin {
				got = append(got, o.String())
			}
		}
		if !slices.Equal(got, wantOps) {
			t.Errorf("hairpin ops %q, want %q", got, wantOps)
		}
		p.apply(st)
		if next.Name == a.Name {
			a = next
		} else {
			b = next
		}
	}
	// a drops 10.244.1.2: b still has it, only 10.244.1.3 stays with a.
	step(dt.Svc("ns", "a", "http", "10.96.0.1", 80, dt.EP("10.244.1.3", 80, dt.Local)))
	// b moves to 10.244.1.4: 10.244.1.2 has no holder left.
	step(dt.Svc("ns", "b", "http", "10.96.0.2", 80, dt.EP("10.244.1.4", 81, dt.Local)),
		"delete element hairpin-endpoints { 10.244.1.2 . 10.244.1.2 }",
		"add element hairpin-endpoints { 10.244.1.4 . 10.244.1.4 }")
	// A full render agrees with the counts kept incrementally.
	if full := stateOf(dt.PortsOf(a, b), np); !maps.Equal(counts(full), counts(st)) {
		t.Errorf("incremental counts %v, full render %v", counts(st), counts(full))
	}
}

// TestClusterIPRefCounts: the ports of one service share its cluster IP
// in cluster-ips, which stays while any of them does, and whatever their
// endpoints (traffic to a port the cluster IP lacks is rejected).
func TestClusterIPRefCounts(t *testing.T) {
	np := newNodePolicy(ipv4, testConfig)
	http := dt.Svc("ns", "a", "http", "10.96.0.1", 80, dt.EP("10.244.1.2", 80))
	https := dt.Svc("ns", "a", "https", "10.96.0.1", 443)
	other := dt.Svc("ns", "b", "http", "10.96.0.2", 80, dt.EP("10.244.1.3", 80))
	ports := dt.PortsOf(http, https, other)
	st := stateOf(ports, np)
	counts := func(st *familyState) refCounts { return st.ts.main().counted[setClusterIPs] }
	if want := (refCounts{"10.96.0.1": 2, "10.96.0.2": 1}); !maps.Equal(counts(st), want) {
		t.Fatalf("cluster IP counts %v, want %v", counts(st), want)
	}
	remove := func(name model.ServicePortName, wantOps ...string) {
		t.Helper()
		delete(ports, name)
		p := planIncremental(st, ports, model.ChangeSet{name: {}}, np)
		var got []string
		for _, o := range p.ops {
			if o.name == setClusterIPs {
				got = append(got, o.String())
			}
		}
		if !slices.Equal(got, wantOps) {
			t.Errorf("cluster-ips ops %q, want %q", got, wantOps)
		}
		p.apply(st)
	}
	// The service keeps its https port: its cluster IP stays.
	remove(http.Name)
	// Its last port goes, and the cluster IP with it.
	remove(https.Name, "delete element cluster-ips { 10.96.0.1 }")
	if full := stateOf(ports, np); !maps.Equal(counts(full), counts(st)) {
		t.Errorf("incremental counts %v, full render %v", counts(st), counts(full))
	}
}

func TestIncrementalOnlyNamesChangedPorts(t *testing.T) {
	np := newNodePolicy(ipv4, testConfig)
	ports := dt.ManyPorts(100, 2)
	st := stateOf(ports, np)
	names := model.SortedNames(ports)
	a, b, c := names[3], names[50], names[99]

	next := maps.Clone(ports)
	// a loses all endpoints, b is deleted, c gains ClientIP affinity.
	next[a] = dt.Svc(a.Namespace, a.Name, a.Port, ports[a].ClusterIP.String(), 80)
	delete(next, b)
	cc := *ports[c]
	cc.AffinityTimeout = time.Hour
	next[c] = &cc
	p := planIncremental(st, next, model.ChangeSet{a: {}, b: {}, c: {}}, np)
	ops, stale := p.ops, p.stale

	allowed := []string{namesFor(a).base, namesFor(b).base, namesFor(c).base}
	for _, o := range ops {
		s := o.String()
		if o.name == setHairpin {
			// a's and b's endpoints go (no other port has them).
			for _, e := range slices.Concat(o.elems...) {
				if !strings.HasPrefix(e.text, ports[a].Endpoints[0].IP.String()+" ") && !strings.HasPrefix(e.text, ports[b].Endpoints[0].IP.String()+" ") {
					t.Errorf("op touches another port's hairpin element: %s", s)
				}
			}
			continue
		}
		if o.name == setClusterIPs {
			// b's cluster IP goes (b was its service's only port).
			for _, e := range slices.Concat(o.elems...) {
				if o.kind != opDelElems || e.text != ports[b].ClusterIP.String() {
					t.Errorf("op touches another port's cluster IP: %s", s)
				}
			}
			continue
		}
		if sharedMaps[o.name] {
			// Elements of shared maps must all belong to a changed port:
			// they go to its chains or carry its name.
			for _, e := range slices.Concat(o.elems...) {
				if !slices.ContainsFunc([]model.ServicePortName{a, b, c}, func(name model.ServicePortName) bool {
					n := namesFor(name)
					return e.comment == n.comment || portHash(e.verdict.Chain) == portHash(n.service)
				}) {
					t.Errorf("op touches another port's element: %s", s)
				}
			}
			continue
		}
		if !slices.ContainsFunc(allowed, func(base string) bool { return strings.Contains(o.name, base) }) {
			t.Errorf("op touches an object of an unchanged port: %s", s)
		}
	}
	got := strings.Join(opStrings(ops), "\n")
	for _, want := range []string{
		// a: cluster IP goes from its service chain to reject.
		"delete element service-ips { " + ports[a].ClusterIP.String() + " . tcp . 80 : goto " + namesFor(a).service,
		"add element no-endpoint-services { " + ports[a].ClusterIP.String() + " . tcp . 80 : goto reject-chain",
		"flush chain " + namesFor(a).service,
		// b: gone entirely.
		"delete element service-ips { " + ports[b].ClusterIP.String() + " . tcp . 80 : goto " + namesFor(b).service,
		"flush chain " + namesFor(b).service,
		// c: affinity sets appear, chains are rewritten.
		"add set affinity-",
		"flush chain " + namesFor(c).service,
	} {
		if !strings.Contains(got, want) {
			t.Errorf("plan lacks %q:\n%s", want, got)
		}
	}
	// a's and b's service chains are stale (they have no endpoint chains).
	if len(stale) != 2 {
		t.Errorf("stale chains %v, want 2", stale)
	}
}

func TestIncrementalUnchangedPortIsNoop(t *testing.T) {
	np := newNodePolicy(ipv4, testConfig)
	ports := dt.ManyPorts(10, 3)
	st := stateOf(ports, np)
	name := model.SortedNames(ports)[4]
	if p := planIncremental(st, ports, model.ChangeSet{name: {}}, np); len(p.ops) != 0 || len(p.stale) != 0 {
		t.Errorf("re-syncing an unchanged port: %v, stale %v", opStrings(p.ops), p.stale)
	}
	missingName := model.ServicePortName{Namespace: "ns", Name: "never-existed", Protocol: "TCP"}
	if p := planIncremental(st, ports, model.ChangeSet{missingName: {}}, np); slices.ContainsFunc(p.changes, func(ch []portChange) bool { return len(ch) > 0 }) {
		t.Errorf("deleting a port never programmed: %v", p.changes)
	}
}

func TestSharedKeyConflicts(t *testing.T) {
	np := newNodePolicy(ipv4, testConfig)
	// Two services claim external IP 198.18.50.5 port 80.
	first := dt.Svc("a", "first", "http", "10.96.0.1", 80, dt.ExternalIPs("198.18.50.5"), dt.EP("10.244.1.1", 80))
	second := dt.Svc("b", "second", "http", "10.96.0.2", 80, dt.ExternalIPs("198.18.50.5"), dt.EP("10.244.1.2", 80))
	ts, claims := render(ipv4, dt.PortsOf(first, second), np)
	var owners []string
	for _, rs := range ts {
		for name, objs := range rs.ports {
			for _, e := range objs.shared.of(mapServiceIPs) {
				if strings.HasPrefix(e.text, "198.18.50.5 ") {
					owners = append(owners, name.Name)
				}
			}
		}
	}
	if !slices.Equal(owners, []string{"first"}) {
		t.Fatalf("external IP owned by %q, want the first by name only", owners)
	}
	// An incremental sync of the second port keeps away from the key.
	st := &familyState{ts: ts, claims: claims}
	second2 := dt.Svc("b", "second", "http", "10.96.0.2", 80, dt.ExternalIPs("198.18.50.5"), dt.EP("10.244.1.2", 80), dt.EP("10.244.1.3", 80))
	p := planIncremental(st, dt.PortsOf(first, second2), model.ChangeSet{second.Name: {}}, np)
	if len(p.ops) == 0 {
		t.Fatal("no ops for a changed port")
	}
	for _, o := range p.ops {
		if o.name == mapServiceIPs && strings.Contains(o.String(), "198.18.50.5") {
			t.Errorf("incremental sync of the second port touches the first's key: %s", o)
		}
	}
}

func TestFullPlanInPlace(t *testing.T) {
	np := newNodePolicy(ipv4, testConfig)
	sp := dt.Svc("default", "session", "http", "10.96.0.30", 80, dt.Affinity(time.Hour), dt.EP("10.244.1.2", 8080))
	ts, _ := render(ipv4, dt.PortsOf(sp), np)
	rs := ts.service(namesFor(sp.Name).table) // the table of the port's chains and sets
	_, affinitySet := endpointNames(namesFor(sp.Name).base, sp.Endpoints[0])

	// The kernel has the service table from an earlier agent: the same objects,
	// plus a stale chain, a base chain at the wrong priority and a
	// service-ips map, and the affinity set with its state.
	kt := &kernelTable{chains: map[string]*nftables.Chain{}, sets: map[string]*nftables.Set{}}
	for _, c := range rs.allChains() {
		kc := &nftables.Chain{Name: c.Name}
		if c.Hook != nil {
			prio := c.Hook.Priority
			if c.Name == chainNATPrerouting {
				prio = -100
			}
			kc.Type, kc.Hooknum, kc.Priority = c.Hook.Type, nftables.ChainHookRef(c.Hook.Num), nftables.ChainPriorityRef(prio)
		}
		kt.chains[c.Name] = kc
	}
	kt.chains["service-OLD-default/gone/tcp/http"] = &nftables.Chain{Name: "service-OLD-default/gone/tcp/http"}
	for _, s := range rs.objects().sets {
		kt.sets[s.name] = s.kernel(nil)
	}
	kt.sets["affinity-OLD-default/gone/tcp/http__10.244.9.9/80"] = &nftables.Set{HasTimeout: true, Dynamic: true, Timeout: time.Hour}

	ops, stale := fullPlan(rs, kt)
	got := opStrings(ops)
	has := func(s string) bool { return slices.Contains(got, s) }
	for _, want := range []string{
		"add table",
		"flush chain " + chainServices,
		"flush map " + mapServiceIPs,
		"delete chain " + chainNATPrerouting,
		"add chain " + chainNATPrerouting,
		"delete set affinity-OLD-default/gone/tcp/http__10.244.9.9/80",
		"flush chain service-OLD-default/gone/tcp/http",
	} {
		if !has(want) {
			t.Errorf("full plan lacks %q", want)
		}
	}
	for _, unwanted := range []string{
		"flush set " + affinitySet, "delete set " + affinitySet, "add set " + affinitySet,
		"add chain " + chainServices, "delete table",
	} {
		if has(unwanted) {
			t.Errorf("full plan has %q: affinity state and existing chains must be kept", unwanted)
		}
	}
	if !slices.Equal(stale, []string{"service-OLD-default/gone/tcp/http"}) {
		t.Errorf("stale %v", stale)
	}

	// The endpoint choice map (numgen keys) was made without nft's
	// description of it (an agent before typeof): the plan makes it
	// anew. With the description, it is flushed and kept.
	var vmap string
	for _, s := range rs.objects().sets {
		if s.numgenKey > 0 {
			vmap = s.name
		}
	}
	if vmap == "" {
		t.Fatal("no map of numgen keys in the affinity service's objects")
	}
	for _, want := range []string{"delete map " + vmap, "add map " + vmap} {
		if !has(want) {
			t.Errorf("full plan over a map without nft's description lacks %q", want)
		}
	}
	def := rs.objects().sets[vmap].def()
	ud, err := def.Userdata()
	if err != nil {
		t.Fatal(err)
	}
	kt.userdata = map[string][]byte{vmap: ud}
	ops, _ = fullPlan(rs, kt)
	got = opStrings(ops)
	if !slices.Contains(got, "flush map "+vmap) || slices.Contains(got, "delete map "+vmap) {
		t.Errorf("full plan over a map with nft's description: want it flushed, not deleted: %v", got)
	}

	// Without a table, the plan creates everything.
	ops, stale = fullPlan(rs, nil)
	if len(stale) != 0 || ops[0].kind != opAddTable {
		t.Fatalf("plan for a missing table: %v, stale %v", opStrings(ops)[:1], stale)
	}
	chains, sets := 0, 0
	for _, o := range ops {
		switch o.kind {
		case opAddChain:
			chains++
		case opAddSet:
			sets++
		case opFlushChain, opFlushSet, opDelChain, opDelSet:
			t.Errorf("plan for a missing table: %s", o)
		}
	}
	if want := rs.objects(); chains != len(want.chains) || sets != len(want.sets) {
		t.Errorf("plan for a missing table adds %d chains and %d sets, want %d and %d", chains, sets, len(want.chains), len(want.sets))
	}
}
