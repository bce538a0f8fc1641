package nftables

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"

	"github.com/proxyshift/proxyshift/nodeagent/dataplane"
	dt "github.com/proxyshift/proxyshift/nodeagent/dataplane/dataplanetest"
	"github.com/proxyshift/proxyshift/nodeagent/dataplane/internal/nft"
	"github.com/proxyshift/proxyshift/nodeagent/dataplane/internal/nft/nfttest"
	"github.com/proxyshift/proxyshift/nodeagent/model"
	"github.com/proxyshift/proxyshift/test/netlab"
)

// The kernel tests program a network namespace of their own and read it
// back through google/nftables' list calls, never through the backend's
// own memory.

// kernelConfig is testConfig with NodePort addresses in both families.
var kernelConfig = func() dataplane.NodeConfig {
	c := testConfig
	c.NodeIPs = []netip.Addr{netip.MustParseAddr("192.168.1.10"), netip.MustParseAddr("2001:db8::10")}
	return c
}()

// kernelNS returns a fresh network namespace and a google/nftables
// connection reading it.
func kernelNS(t testing.TB) (*netlab.NetNS, *nftables.Conn) {
	t.Helper()
	netlab.RequireRoot(t)
	ns := netlab.NewNetNS(t, "nft")
	conn, err := nftables.New(nftables.WithNetNSFd(ns.FD()))
	if err != nil {
		t.Fatal(err)
	}
	return ns, conn
}

func newBackend(t testing.TB, ns *netlab.NetNS) *Backend {
	t.Helper()
	b, err := New(kernelConfig, WithNetNS(ns.NS()))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// testModel is a mix of every kind of service, in both families.
func testModel() *model.Snapshot {
	v4 := dt.PortsOf(
		dt.Svc("default", "web", "http", "10.96.0.10", 80, dt.EP("10.244.1.2", 8080), dt.EP("10.244.2.3", 8080), dt.EP("10.244.3.4", 8080)),
		dt.Svc("default", "np", "http", "10.96.0.11", 80, dt.NodePort(30080), dt.EP("10.244.1.5", 8080, dt.Local)),
		dt.Svc("shop", "front", "https", "10.96.0.20", 443, dt.NodePort(30443), dt.LB("198.18.100.1"),
			dt.SourceRanges("203.0.113.0/24", "192.168.1.0/24"), dt.EP("10.244.1.6", 8443)),
		dt.Svc("default", "session", "http", "10.96.0.30", 80, dt.Affinity(time.Hour), dt.EP("10.244.1.7", 8080), dt.EP("10.244.2.7", 8080)),
		dt.Svc("default", "empty", "http", "10.96.0.40", 80, dt.NodePort(30040), dt.ExternalIPs("198.18.50.6")),
		dt.Svc("default", "ingress", "http", "10.96.0.80", 80, dt.NodePort(30081), dt.LB("198.18.100.2"), dt.ETPLocal, dt.EP("10.244.2.8", 8080)),
		dt.Svc("default", "dns", "dns", "10.96.0.53", 53, dt.UDP, dt.ExternalIPs("198.18.50.5"), dt.EP("10.244.1.9", 53)),
	)
	v6 := dt.PortsOf(
		dt.Svc("default", "web", "http", "fd00:10:96::10", 80, dt.NodePort(30080), dt.EP("fd00:10:244:1::2", 8080), dt.EP("fd00:10:244:2::3", 8080, dt.Local)),
	)
	return &model.Snapshot{Ports: map[corev1.IPFamily]map[model.ServicePortName]*model.ServicePort{
		corev1.IPv4Protocol: v4, corev1.IPv6Protocol: v6,
	}}
}

// expected renders the model as the backend should have programmed it.
func expected(m *model.Snapshot) map[*family]tables {
	out := map[*family]tables{}
	for _, f := range families {
		out[f], _ = render(f, m.Ports[f.Model], newNodePolicy(f, kernelConfig))
	}
	return out
}

// tableView is a family's tables as the kernel lists them: each chain's
// rule count and hook, and the values of each rule's anonymous map,
// each set's elements (key in hex, verdict, comment); nil elements for
// the affinity sets, whose contents are the packet path's. Chains and
// sets are keyed by viewKey.
type tableView struct {
	chains map[string]string
	sets   map[string][]string
}

// viewKey is the key of table's object name in a tableView.
func viewKey(table, name string) string { return table + " " + name }

func viewOf(ts tables) tableView {
	v := tableView{chains: map[string]string{}, sets: map[string][]string{}}
	for _, rs := range ts {
		for _, c := range rs.allChains() {
			summary := chainSummary(len(c.Rules), c.Hook != nil, c.Hook)
			for _, r := range c.Rules {
				if m := r.Anon; m != nil {
					var values []string
					for i := range m.Len() {
						size := int(m.DataType.Bytes)
						values = append(values, hex.EncodeToString(m.Values[i*size:(i+1)*size]))
					}
					summary += " {" + strings.Join(values, ",") + "}"
				}
			}
			v.chains[viewKey(rs.name, c.Name)] = summary
		}
		objs := rs.objects()
		for _, s := range objs.sets {
			if s.dynamic() {
				v.sets[viewKey(rs.name, s.name)] = nil
				continue
			}
			elems := []string{}
			for _, e := range slices.Concat(objs.elems[s.name]...) {
				d := hex.EncodeToString(e.key())
				if e.verdict != nil {
					d += " : " + e.verdict.String()
				}
				if e.data() != nil {
					d += " : " + hex.EncodeToString(e.data())
				}
				elems = append(elems, d+" "+e.comment)
			}
			slices.Sort(elems)
			v.sets[viewKey(rs.name, s.name)] = elems
		}
	}
	return v
}

func chainSummary(rules int, base bool, h *hook) string {
	if !base {
		return strings.Repeat("r", rules)
	}
	return strings.Repeat("r", rules) + " " + string(h.Type) + " " + h.Name + " " + itoa(int32(h.Priority))
}

var hookNames = map[nftables.ChainHook]string{0: "prerouting", 1: "input", 2: "forward", 3: "output", 4: "postrouting"}

// kernelView lists our tables of family f in the namespace ns; ok is
// false if the main table is absent.
func kernelView(t *testing.T, ns *netlab.NetNS, conn *nftables.Conn, f *family) (v tableView, ok bool) {
	t.Helper()
	tables, err := conn.ListTablesOfFamily(f.Table)
	if err != nil {
		t.Fatal(err)
	}
	v = tableView{chains: map[string]string{}, sets: map[string][]string{}}
	for _, table := range tables {
		if !slices.Contains(TableNames(), table.Name) {
			continue
		}
		ok = ok || table.Name == TableName
		viewTable(t, ns, conn, f, table, v)
	}
	return v, ok
}

// viewTable adds one table to v.
func viewTable(t *testing.T, ns *netlab.NetNS, conn *nftables.Conn, f *family, table *nftables.Table, v tableView) {
	t.Helper()
	chains, err := conn.ListChainsOfTableFamily(f.Table)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range chains {
		if c.Table.Name != table.Name {
			continue
		}
		rules, err := conn.GetRules(table, c)
		if err != nil {
			t.Fatalf("rules of %s: %v", c.Name, err)
		}
		var h *hook
		if c.Hooknum != nil {
			h = &hook{Type: c.Type, Name: hookNames[*c.Hooknum], Priority: *c.Priority}
		}
		summary := chainSummary(len(rules), h != nil, h)
		for _, r := range rules {
			for _, e := range r.Exprs {
				if l, ok := e.(*expr.Lookup); ok && strings.HasPrefix(l.SetName, "__map") {
					summary += " {" + strings.Join(anonValues(t, conn, table, l.SetName), ",") + "}"
				}
			}
		}
		v.chains[viewKey(table.Name, c.Name)] = summary
	}
	sets, err := conn.GetSets(table)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range sets {
		if s.Anonymous {
			continue
		}
		if s.HasTimeout {
			v.sets[viewKey(table.Name, s.Name)] = nil
			continue
		}
		kelems, err := conn.GetSetElements(s)
		if err != nil {
			t.Fatalf("elements of %s: %v", s.Name, err)
		}
		var verdicts map[string]string
		dataMap := kernelDataMap(s)
		if s.IsMap && !dataMap {
			verdicts = mapVerdicts(t, ns, f, table.Name, s.Name)
		}
		elems := []string{}
		for _, e := range kelems {
			if e.IntervalEnd {
				continue
			}
			d := hex.EncodeToString(e.Key)
			switch {
			case dataMap:
				d += " : " + hex.EncodeToString(e.Val)
			case s.IsMap:
				d += " : " + verdicts[d]
			}
			elems = append(elems, d+" "+e.Comment)
		}
		slices.Sort(elems)
		v.sets[viewKey(table.Name, s.Name)] = elems
	}
}

// anonValues are the values of anonymous map name of table, in the
// order of their keys (0, 1, ...), in hex.
func anonValues(t *testing.T, conn *nftables.Conn, table *nftables.Table, name string) []string {
	t.Helper()
	elems, err := conn.GetSetElements(&nftables.Set{Table: table, Name: name, IsMap: true, KeyType: nftables.TypeInteger})
	if err != nil {
		t.Fatalf("elements of %s: %v", name, err)
	}
	values := make([]string, len(elems))
	for _, e := range elems {
		i := int(binary.NativeEndian.Uint32(e.Key))
		if i >= len(values) {
			t.Fatalf("map %s has key %d of %d", name, i, len(elems))
		}
		values[i] = hex.EncodeToString(e.Val)
	}
	return values
}

// mapVerdicts lists the verdicts of a verdict map's elements by key (in
// hex), from a netlink dump of its elements: google/nftables reads back
// keys and comments but not verdicts.
func mapVerdicts(t *testing.T, ns *netlab.NetNS, f *family, table, set string) map[string]string {
	t.Helper()
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: ns.FD()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ae := netlink.NewAttributeEncoder()
	ae.String(unix.NFTA_SET_ELEM_LIST_TABLE, table)
	ae.String(unix.NFTA_SET_ELEM_LIST_SET, set)
	attrs, err := ae.Encode()
	if err != nil {
		t.Fatal(err)
	}
	msgs, err := c.Execute(netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETSETELEM), Flags: netlink.Request | netlink.Dump},
		Data:   append([]byte{byte(f.Table), unix.NFNETLINK_V0, 0, 0}, attrs...),
	})
	if err != nil {
		t.Fatalf("dump elements of %s: %v", set, err)
	}
	out := map[string]string{}
	nested := func(b []byte, fn func(*netlink.AttributeDecoder)) {
		ad, err := netlink.NewAttributeDecoder(b)
		if err != nil {
			t.Fatal(err)
		}
		ad.ByteOrder = binary.BigEndian
		for ad.Next() {
			fn(ad)
		}
	}
	for _, m := range msgs {
		nested(m.Data[4:], func(ad *netlink.AttributeDecoder) {
			if ad.Type() != unix.NFTA_SET_ELEM_LIST_ELEMENTS {
				return
			}
			nested(ad.Bytes(), func(ad *netlink.AttributeDecoder) {
				var key string
				v := &nft.Verdict{}
				nested(ad.Bytes(), func(ad *netlink.AttributeDecoder) {
					switch ad.Type() {
					case unix.NFTA_SET_ELEM_KEY:
						nested(ad.Bytes(), func(ad *netlink.AttributeDecoder) { key = hex.EncodeToString(ad.Bytes()) })
					case unix.NFTA_SET_ELEM_DATA:
						nested(ad.Bytes(), func(ad *netlink.AttributeDecoder) {
							nested(ad.Bytes(), func(ad *netlink.AttributeDecoder) {
								switch ad.Type() {
								case unix.NFTA_VERDICT_CODE:
									v.Kind = expr.VerdictKind(int32(ad.Uint32()))
								case unix.NFTA_VERDICT_CHAIN:
									v.Chain = ad.String()
								}
							})
						})
					}
				})
				out[key] = v.String()
			})
		})
	}
	return out
}

// assertProgrammed checks that the kernel holds exactly the rendering of
// m in both families.
func assertProgrammed(t *testing.T, ns *netlab.NetNS, conn *nftables.Conn, m *model.Snapshot, b *Backend) {
	t.Helper()
	for f, ts := range expected(m) {
		got, ok := kernelView(t, ns, conn, f)
		if !ok {
			t.Errorf("table %s %s is missing", f.Name, TableName)
			continue
		}
		want := viewOf(ts)
		for _, name := range slices.Sorted(maps.Keys(want.chains)) {
			if g, ok := got.chains[name]; !ok {
				t.Errorf("%s: chain %s is missing", f.Name, name)
			} else if g != want.chains[name] {
				t.Errorf("%s: chain %s: kernel %q, want %q (r = one rule)", f.Name, name, g, want.chains[name])
			}
		}
		for name := range got.chains {
			if _, ok := want.chains[name]; !ok {
				t.Errorf("%s: unexpected chain %s", f.Name, name)
			}
		}
		for _, name := range slices.Sorted(maps.Keys(want.sets)) {
			if g, ok := got.sets[name]; !ok {
				t.Errorf("%s: set %s is missing", f.Name, name)
			} else if !slices.Equal(g, want.sets[name]) {
				t.Errorf("%s: set %s: kernel has\n\t%s\nwant\n\t%s", f.Name, name, strings.Join(g, "\n\t"), strings.Join(want.sets[name], "\n\t"))
			}
		}
		for name := range got.sets {
			if _, ok := want.sets[name]; !ok {
				t.Errorf("%s: unexpected set %s", f.Name, name)
			}
		}
	}
}

func mustSync(t *testing.T, b *Backend, req dataplane.SyncRequest) dataplane.Counts {
	t.Helper()
	c, err := b.Sync(context.Background(), req)
	if err != nil {
		t.Fatalf("sync: %v", err)
	}
	p, err := b.Programmed(context.Background())
	if err != nil {
		t.Fatalf("programmed: %v", err)
	}
	if p != c {
		t.Errorf("Sync reported %+v, Programmed reads back %+v", c, p)
	}
	return c
}

func TestKernelSyncReadsBack(t *testing.T) {
	ns, conn := kernelNS(t)
	b := newBackend(t, ns)
	if present, err := b.Present(context.Background()); err != nil || present {
		t.Fatalf("Present before any sync: %v, %v", present, err)
	}
	m := testModel()
	c := mustSync(t, b, dataplane.SyncRequest{Model: m, Full: true})
	// 8 service ports; endpoints 3+1+1+2+0+1+1 and 2.
	if c.Services != 8 || c.Endpoints != 11 {
		t.Errorf("counts %+v, want 8 services and 11 endpoints", c)
	}
	assertProgrammed(t, ns, conn, m, b)
	if present, err := b.Present(context.Background()); err != nil || !present {
		t.Errorf("Present after a sync: %v, %v", present, err)
	}

	// A full resync of unchanged tables recognizes every chain and set
	// the kernel lists as its own: it only flushes and refills them.
	for f, ts := range expected(m) {
		kts, err := b.list(context.Background(), f)
		if err != nil {
			t.Fatal(err)
		}
		for _, rs := range ts {
			ops, stale := fullPlan(rs, kts[rs.name])
			for _, o := range ops {
				switch o.kind {
				case opAddChain, opDelChain, opAddSet, opDelSet, opDelTable:
					t.Errorf("%s %s: full resync of an unchanged table: %s", f.Name, rs.name, o)
				}
			}
			if len(stale) > 0 {
				t.Errorf("%s %s: stale chains in an unchanged table: %v", f.Name, rs.name, stale)
			}
		}
	}
	mustSync(t, b, dataplane.SyncRequest{Model: m, Full: true})
	assertProgrammed(t, ns, conn, m, b)
}

func TestKernelIncrementalSync(t *testing.T) {
	ns, conn := kernelNS(t)
	b := newBackend(t, ns)
	m := testModel()
	mustSync(t, b, dataplane.SyncRequest{Model: m})

	v4 := m.Ports[corev1.IPv4Protocol]
	web := model.ServicePortName{Namespace: "default", Name: "web", Port: "http", Protocol: corev1.ProtocolTCP}
	session := model.ServicePortName{Namespace: "default", Name: "session", Port: "http", Protocol: corev1.ProtocolTCP}
	empty := model.ServicePortName{Namespace: "default", Name: "empty", Port: "http", Protocol: corev1.ProtocolTCP}
	oldChain, _ := endpointNames(namesFor(web).base, v4[web].Endpoints[2])

	// web's third endpoint moves; session goes away; empty gets an
	// endpoint; a new service appears.
	v4[web] = dt.Svc("default", "web", "http", "10.96.0.10", 80, dt.EP("10.244.1.2", 8080), dt.EP("10.244.2.3", 8080), dt.EP("10.244.3.99", 8080))
	delete(v4, session)
	v4[empty] = dt.Svc("default", "empty", "http", "10.96.0.40", 80, dt.NodePort(30040), dt.ExternalIPs("198.18.50.6"), dt.EP("10.244.4.4", 80))
	added := dt.Svc("default", "new", "grpc", "10.96.0.90", 9090, dt.EP("10.244.4.5", 9090))
	v4[added.Name] = added
	c := mustSync(t, b, dataplane.SyncRequest{Model: m, Changed: model.ChangeSet{web: {}, session: {}, empty: {}, added.Name: {}}})
	assertProgrammed(t, ns, conn, m, b)
	if c.Services != 8 || c.Endpoints != 11 {
		t.Errorf("counts %+v, want 8 services and 11 endpoints", c)
	}
	if len(b.stale[ipv4]) != 0 {
		t.Errorf("stale chains left: %v", b.stale[ipv4])
	}
	if kv, _ := kernelView(t, ns, conn, ipv4); kv.chains[oldChain] != "" {
		t.Errorf("old endpoint chain %s is still there", oldChain)
	}
	// What the backend keeps of its syncs, full and incremental, is rules
	// by their text, not their expressions (ruleset.written).
	var chains []*chain
	for _, rs := range slices.Concat(b.state[ipv4].ts, b.state[ipv6].ts) {
		chains = append(chains, rs.allChains()...)
	}
	for _, c := range chains {
		for _, r := range c.Rules {
			if r.Text == "" || r.Exprs != nil || r.Anon != nil {
				t.Fatalf("chain %s keeps rule %q with %d expressions after its sync", c.Name, r.Text, len(r.Exprs))
			}
		}
	}
}

func TestKernelRepairsDrift(t *testing.T) {
	ns, conn := kernelNS(t)
	b := newBackend(t, ns)
	m := testModel()
	mustSync(t, b, dataplane.SyncRequest{Model: m, Full: true})
	v4 := &nftables.Table{Name: TableName, Family: nftables.TableFamilyIPv4}
	// A service table of each family that holds ports.
	v4Services := &nftables.Table{Name: serviceTableName(namesFor(model.SortedNames(m.Ports[corev1.IPv4Protocol])[0]).table), Family: nftables.TableFamilyIPv4}
	v6 := &nftables.Table{Name: serviceTableName(namesFor(model.SortedNames(m.Ports[corev1.IPv6Protocol])[0]).table), Family: nftables.TableFamilyIPv6}

	// Someone deletes the ip table by hand; a full sync restores it.
	conn.DelTable(v4)
	if err := conn.Flush(); err != nil {
		t.Fatal(err)
	}
	if _, ok := kernelView(t, ns, conn, ipv4); ok {
		t.Fatal("table still there after deleting it")
	}
	mustSync(t, b, dataplane.SyncRequest{Model: m, Full: true})
	assertProgrammed(t, ns, conn, m, b)

	// Someone flushes a chain, deletes a map element and adds a chain of
	// their own; a full sync puts everything back and removes the extra.
	conn.FlushChain(&nftables.Chain{Name: chainServices, Table: v4Services})
	elems, err := conn.GetSetElements(&nftables.Set{Name: mapServiceIPs, Table: v6, IsMap: true})
	if err != nil || len(elems) == 0 {
		t.Fatalf("service-ips of ip6: %v, %v", elems, err)
	}
	if err := conn.SetDeleteElements(&nftables.Set{Name: mapServiceIPs, Table: v6, IsMap: true}, elems[:1]); err != nil {
		t.Fatal(err)
	}
	conn.AddChain(&nftables.Chain{Name: "intruder", Table: v4})
	if err := conn.Flush(); err != nil {
		t.Fatal(err)
	}
	mustSync(t, b, dataplane.SyncRequest{Model: m, Full: true})
	assertProgrammed(t, ns, conn, m, b)

	// Someone replaces service-ips by a map of the same name and flags but
	// another key: the in-place rewrite fails on it, and the sync falls
	// back to replacing the whole table.
	conn.FlushChain(&nftables.Chain{Name: chainServices, Table: v4Services})
	conn.FlushSet(&nftables.Set{Name: mapServiceIPs, Table: v4Services})
	conn.DelSet(&nftables.Set{Name: mapServiceIPs, Table: v4Services})
	if err := conn.AddSet(&nftables.Set{Name: mapServiceIPs, Table: v4Services, ID: 1, IsMap: true, Concatenation: true,
		KeyType: nftables.MustConcatSetType(nftables.TypeInetProto, nftables.TypeInetService), DataType: nftables.TypeVerdict}, nil); err != nil {
		t.Fatal(err)
	}
	if err := conn.Flush(); err != nil {
		t.Fatal(err)
	}
	mustSync(t, b, dataplane.SyncRequest{Model: m, Full: true})
	assertProgrammed(t, ns, conn, m, b)

	// The service table of web disappears, and the next sync is an
	// incremental one of web: it fails against the missing table and
	// falls back to a full sync, which restores it.
	name := model.ServicePortName{Namespace: "default", Name: "web", Port: "http", Protocol: corev1.ProtocolTCP}
	conn.DelTable(&nftables.Table{Name: serviceTableName(namesFor(name).table), Family: nftables.TableFamilyIPv4})
	if err := conn.Flush(); err != nil {
		t.Fatal(err)
	}
	m.Ports[corev1.IPv4Protocol][name] = dt.Svc("default", "web", "http", "10.96.0.10", 80, dt.EP("10.244.1.2", 8080))
	mustSync(t, b, dataplane.SyncRequest{Model: m, Changed: model.ChangeSet{name: {}}})
	assertProgrammed(t, ns, conn, m, b)
}

func TestKernelRestartKeepsRulesAndAffinity(t *testing.T) {
	ns, conn := kernelNS(t)
	m := testModel()
	before := mustSync(t, newBackend(t, ns), dataplane.SyncRequest{Model: m, Full: true})

	// A client is stuck to the session service's first endpoint.
	session := m.Ports[corev1.IPv4Protocol][model.ServicePortName{Namespace: "default", Name: "session", Port: "http", Protocol: corev1.ProtocolTCP}]
	_, affinitySet := endpointNames(namesFor(session.Name).base, session.Endpoints[0])
	as := &nftables.Set{Name: affinitySet, Table: &nftables.Table{Name: serviceTableName(namesFor(session.Name).table), Family: nftables.TableFamilyIPv4}, KeyType: nftables.TypeIPAddr, HasTimeout: true}
	client := []nftables.SetElement{{Key: netip.MustParseAddr("198.18.7.7").AsSlice(), Timeout: time.Hour}}
	if err := conn.SetAddElements(as, client); err != nil {
		t.Fatal(err)
	}
	if err := conn.Flush(); err != nil {
		t.Fatal(err)
	}

	// The agent restarts: a new backend must leave the kernel alone until
	// its first sync...
	b := newBackend(t, ns)
	if p, err := b.Programmed(context.Background()); err != nil || p != before {
		t.Fatalf("after New: programmed %+v (%v), want %+v", p, err, before)
	}
	assertProgrammed(t, ns, conn, m, b)
	// ...which is a full one even if not asked for, keeps the affinity
	// state, and removes what belonged to a service deleted while the
	// agent was down.
	delete(m.Ports[corev1.IPv4Protocol], model.ServicePortName{Namespace: "default", Name: "web", Port: "http", Protocol: corev1.ProtocolTCP})
	mustSync(t, b, dataplane.SyncRequest{Model: m})
	assertProgrammed(t, ns, conn, m, b)
	elems, err := conn.GetSetElements(as)
	if err != nil {
		t.Fatal(err)
	}
	if len(elems) != 1 || netip.AddrFrom4([4]byte(elems[0].Key)) != netip.MustParseAddr("198.18.7.7") {
		t.Errorf("affinity set after the first sync of a new backend: %v", elems)
	}
}

func TestKernelRejectedTransactionChangesNothing(t *testing.T) {
	ns, conn := kernelNS(t)
	b := newBackend(t, ns)
	m := testModel()
	mustSync(t, b, dataplane.SyncRequest{Model: m, Full: true})
	// A batch whose last rule jumps to a chain that does not exist: the
	// kernel refuses it whole, including the chain before it.
	err := b.commit(ipv4, tablePlan{table: TableName, ops: []op{
		{kind: opAddChain, name: "half", chain: &chain{Name: "half"}},
		{kind: opFlushChain, name: chainMasquerading},
		{kind: opAddRule, name: "half", rule: nft.NewRule(ipv4).Goto("nowhere").Rule()},
	}})
	if !errors.Is(err, unix.ENOENT) {
		t.Fatalf("commit of a broken batch: %v, want ENOENT", err)
	}
	assertProgrammed(t, ns, conn, m, b)
}

func TestKernelCleanup(t *testing.T) {
	ns, conn := kernelNS(t)
	b := newBackend(t, ns)
	m := testModel()
	mustSync(t, b, dataplane.SyncRequest{Model: m, Full: true})

	removed, err := b.Cleanup(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"nftables table ip proxyshift and its 16 service tables proxyshift-services-*", "nftables table ip6 proxyshift and its 16 service tables proxyshift-services-*"}; !slices.Equal(removed, want) {
		t.Errorf("Cleanup removed %q, want %q", removed, want)
	}
	for _, f := range families {
		if _, ok := kernelView(t, ns, conn, f); ok {
			t.Errorf("table %s %s still there after Cleanup", f.Name, TableName)
		}
	}
	if p, err := b.Programmed(context.Background()); err != nil || p != (dataplane.Counts{}) {
		t.Errorf("Programmed after Cleanup: %+v, %v", p, err)
	}
	removed, err = b.Cleanup(context.Background())
	if err != nil || len(removed) != 0 {
		t.Errorf("second Cleanup: %q, %v", removed, err)
	}
	// The backend starts over with a full sync.
	mustSync(t, b, dataplane.SyncRequest{Model: m})
	assertProgrammed(t, ns, conn, m, b)
}

func TestKernelLeavesOtherTablesAlone(t *testing.T) {
	ns, conn := kernelNS(t)
	other := conn.AddTable(&nftables.Table{Name: "kube-proxy", Family: nftables.TableFamilyIPv4})
	conn.AddChain(&nftables.Chain{Name: "nat-prerouting", Table: other, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityNATDest})
	if err := conn.Flush(); err != nil {
		t.Fatal(err)
	}
	b := newBackend(t, ns)
	mustSync(t, b, dataplane.SyncRequest{Model: testModel(), Full: true})
	if _, err := b.Cleanup(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.ListChain(other, "nat-prerouting"); err != nil {
		t.Errorf("another table's chain is gone: %v", err)
	}
}

// TestKernelForeignTable: a table named proxyshift that another program
// created (without proxyshift's mark) is reported by every call, and left
// exactly as it was; the other family is served as usual.
func TestKernelForeignTable(t *testing.T) {
	ns, _ := kernelNS(t)
	ctx := context.Background()
	before := nfttest.Foreign(t, ns.NS(), nftables.TableFamilyIPv4, TableName)
	unchanged := func(step string) {
		t.Helper()
		if after := nfttest.Snapshot(t, ns.NS(), nftables.TableFamilyIPv4, TableName); after != before {
			t.Errorf("after %s, the foreign table changed:\n%s\nwas\n%s", step, after, before)
		}
	}
	b := newBackend(t, ns)
	if present, err := b.Present(ctx); err != nil || present {
		t.Errorf("Present with only a foreign table: %v, %v; want false", present, err)
	}
	_, err := b.Sync(ctx, dataplane.SyncRequest{Model: testModel(), Full: true})
	nfttest.RequireForeign(t, "Sync", err, "ip", TableName)
	unchanged("Sync")
	if listed := nfttest.List(t, ns.NS(), "ip6", TableName); !strings.Contains(listed, `comment "`+nft.OwnerComment+`"`) {
		t.Errorf("the ip6 table proxyshift created lacks its mark:\n%s", listed)
	}
	_, err = b.Sync(ctx, dataplane.SyncRequest{Model: testModel()})
	nfttest.RequireForeign(t, "second Sync", err, "ip", TableName)
	unchanged("second Sync")
	_, err = b.Programmed(ctx)
	nfttest.RequireForeign(t, "Programmed", err, "ip", TableName)
	removed, err := b.Cleanup(ctx)
	nfttest.RequireForeign(t, "Cleanup", err, "ip", TableName)
	unchanged("Cleanup")
	if want := []string{"nftables table ip6 proxyshift and its 16 service tables proxyshift-services-*"}; !slices.Equal(removed, want) {
		t.Errorf("Cleanup removed %q, want %q", removed, want)
	}
}

// TestKernelTableReplacedByForeign: a table another program puts in the
// place of proxyshift's between two syncs is not written by the next,
// incremental, sync.
func TestKernelTableReplacedByForeign(t *testing.T) {
	ns, conn := kernelNS(t)
	ctx := context.Background()
	b := newBackend(t, ns)
	m := testModel()
	mustSync(t, b, dataplane.SyncRequest{Model: m, Full: true})
	conn.DelTable(&nftables.Table{Name: TableName, Family: nftables.TableFamilyIPv4})
	if err := conn.Flush(); err != nil {
		t.Fatal(err)
	}
	before := nfttest.Foreign(t, ns.NS(), nftables.TableFamilyIPv4, TableName)
	name := model.ServicePortName{Namespace: "default", Name: "web", Port: "http", Protocol: corev1.ProtocolTCP}
	m.Ports[corev1.IPv4Protocol][name].Endpoints = m.Ports[corev1.IPv4Protocol][name].Endpoints[:1]
	_, err := b.Sync(ctx, dataplane.SyncRequest{Model: m, Changed: model.ChangeSet{name: {}}})
	nfttest.RequireForeign(t, "incremental Sync", err, "ip", TableName)
	if after := nfttest.Snapshot(t, ns.NS(), nftables.TableFamilyIPv4, TableName); after != before {
		t.Errorf("the incremental sync changed the foreign table:\n%s\nwas\n%s", after, before)
	}
}
