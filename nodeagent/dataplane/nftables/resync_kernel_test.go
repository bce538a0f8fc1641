package nftables

import (
	"context"
	"encoding/binary"
	"errors"
	"slices"
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"

	"github.com/proxyshift/proxyshift/nodeagent/dataplane"
	dt "github.com/proxyshift/proxyshift/nodeagent/dataplane/dataplanetest"
	"github.com/proxyshift/proxyshift/nodeagent/model"
	"github.com/proxyshift/proxyshift/test/netlab"
)

// generation is the network namespace's nf_tables ruleset generation,
// which every committed transaction, whatever it writes, increments.
func generation(t *testing.T, ns *netlab.NetNS) uint32 {
	t.Helper()
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: ns.FD()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	msgs, err := c.Execute(netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETGEN), Flags: netlink.Request},
		Data:   []byte{unix.AF_UNSPEC, unix.NFNETLINK_V0, 0, 0},
	})
	if err != nil || len(msgs) == 0 || len(msgs[0].Data) < 4 {
		t.Fatalf("ruleset generation: %v, %v", msgs, err)
	}
	ad, err := netlink.NewAttributeDecoder(msgs[0].Data[4:])
	if err != nil {
		t.Fatal(err)
	}
	ad.ByteOrder = binary.BigEndian
	for ad.Next() {
		if ad.Type() == unix.NFTA_GEN_ID {
			return ad.Uint32()
		}
	}
	t.Fatal("no NFTA_GEN_ID in the answer")
	return 0
}

// TestKernelResyncVerifiesWithoutWriting: after a full sync and
// incremental ones of every kind, a periodic resync finds the kernel as
// the backend left it and commits nothing (the ruleset generation stays
// the same), in both families.
func TestKernelResyncVerifiesWithoutWriting(t *testing.T) {
	ns, conn := kernelNS(t)
	b := newBackend(t, ns)
	m := testModel()
	mustSync(t, b, dataplane.SyncRequest{Model: m, Full: true})

	v4 := m.Ports[corev1.IPv4Protocol]
	web := model.ServicePortName{Namespace: "default", Name: "web", Port: "http", Protocol: corev1.ProtocolTCP}
	session := model.ServicePortName{Namespace: "default", Name: "session", Port: "http", Protocol: corev1.ProtocolTCP}
	v4[web] = dt.Svc("default", "web", "http", "10.96.0.10", 80, dt.EP("10.244.1.2", 8080), dt.EP("10.244.3.99", 8080))
	v4[session] = dt.Svc("default", "session", "http", "10.96.0.30", 80, dt.Affinity(600e9), dt.EP("10.244.1.7", 8080))
	added := dt.Svc("default", "new", "grpc", "10.96.0.90", 9090, dt.NodePort(30090), dt.EP("10.244.4.5", 9090))
	v4[added.Name] = added
	mustSync(t, b, dataplane.SyncRequest{Model: m, Changed: model.ChangeSet{web: {}, session: {}, added.Name: {}}})

	gen := generation(t, ns)
	for _, f := range families {
		why, err := b.verify(context.Background(), f, b.state[f])
		if err != nil || why != "" {
			t.Fatalf("%s: verify after the syncs: %q, %v; want no difference", f.Name, why, err)
		}
	}
	mustSync(t, b, dataplane.SyncRequest{Model: m, Full: true, Resync: true})
	if got := generation(t, ns); got != gen {
		t.Errorf("the resync committed %d transactions; want none", got-gen)
	}
	assertProgrammed(t, ns, conn, m, b)
	// A full sync that is not a resync still rewrites.
	mustSync(t, b, dataplane.SyncRequest{Model: m, Full: true})
	if generation(t, ns) == gen {
		t.Error("a full sync committed nothing")
	}
}

// TestKernelResyncRepairsDrift: each kind of damage by hand is found by
// the periodic resync's verification, which then rewrites the table as
// the model says.
func TestKernelResyncRepairsDrift(t *testing.T) {
	ns, conn := kernelNS(t)
	b := newBackend(t, ns)
	m := testModel()
	mustSync(t, b, dataplane.SyncRequest{Model: m, Full: true})
	v4 := &nftables.Table{Name: TableName, Family: nftables.TableFamilyIPv4}
	web := model.ServicePortName{Namespace: "default", Name: "web", Port: "http", Protocol: corev1.ProtocolTCP}
	webChain := namesFor(web).base
	// The service tables of web (IPv4) and of an IPv6 port.
	webTable := &nftables.Table{Name: serviceTableName(namesFor(web).table), Family: nftables.TableFamilyIPv4}
	v6Port := model.SortedNames(m.Ports[corev1.IPv6Protocol])[0]
	v6Table := &nftables.Table{Name: serviceTableName(namesFor(v6Port).table), Family: nftables.TableFamilyIPv6}

	for _, c := range []struct {
		name   string
		damage func()
	}{
		{"table deleted", func() { conn.DelTable(v4) }},
		{"service table deleted", func() { conn.DelTable(webTable) }},
		{"fixed chain flushed", func() { conn.FlushChain(&nftables.Chain{Name: chainServices, Table: webTable}) }},
		{"service chain flushed", func() {
			chains, err := conn.ListChainsOfTableFamily(nftables.TableFamilyIPv4)
			if err != nil {
				t.Fatal(err)
			}
			for _, ch := range chains {
				if slices.Contains(TableNames(), ch.Table.Name) && len(ch.Name) > len(webChain) && ch.Name[len(ch.Name)-len(webChain):] == webChain {
					conn.FlushChain(ch)
					return
				}
			}
			t.Fatalf("no chain ends in %s", webChain)
		}},
		{"verdict-map element deleted", func() {
			s := &nftables.Set{Name: mapServiceIPs, Table: v6Table, IsMap: true}
			elems, err := conn.GetSetElements(s)
			if err != nil || len(elems) == 0 {
				t.Fatalf("service-ips of ip6: %v, %v", elems, err)
			}
			if err := conn.SetDeleteElements(s, elems[:1]); err != nil {
				t.Fatal(err)
			}
		}},
		{"verdict-map element changed", func() {
			s := &nftables.Set{Name: mapServiceIPs, Table: webTable, IsMap: true, KeyType: nftables.MustConcatSetType(nftables.TypeIPAddr, nftables.TypeInetProto, nftables.TypeInetService), DataType: nftables.TypeVerdict}
			elems, err := conn.GetSetElements(s)
			if err != nil || len(elems) == 0 {
				t.Fatalf("service-ips of ip: %v, %v", elems, err)
			}
			e := elems[0]
			if err := conn.SetDeleteElements(s, []nftables.SetElement{{Key: e.Key}}); err != nil {
				t.Fatal(err)
			}
			if err := conn.SetAddElements(s, []nftables.SetElement{{Key: e.Key, VerdictData: &expr.Verdict{Kind: expr.VerdictDrop}}}); err != nil {
				t.Fatal(err)
			}
		}},
		{"foreign chain added", func() { conn.AddChain(&nftables.Chain{Name: "intruder", Table: v4}) }},
		{"foreign set added", func() {
			if err := conn.AddSet(&nftables.Set{Name: "intruder", Table: v6Table, ID: 7, KeyType: nftables.TypeIP6Addr}, nil); err != nil {
				t.Fatal(err)
			}
		}},
		{"rule added to a base chain", func() {
			conn.AddRule(&nftables.Rule{Table: v4, Chain: &nftables.Chain{Name: chainNATPrerouting, Table: v4}})
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			c.damage()
			if err := conn.Flush(); err != nil {
				t.Fatal(err)
			}
			found := ""
			for _, f := range families {
				if _, ok := kernelView(t, ns, conn, f); !ok {
					found = "table missing"
					continue
				}
				why, err := b.verify(context.Background(), f, b.state[f])
				if err != nil {
					t.Fatal(err)
				}
				if why != "" {
					t.Logf("%s: %s", f.Name, why)
					found = why
				}
			}
			if found == "" {
				t.Fatal("the verification found no difference after the damage")
			}
			mustSync(t, b, dataplane.SyncRequest{Model: m, Full: true, Resync: true})
			assertProgrammed(t, ns, conn, m, b)
		})
	}
}

// TestKernelResyncStopsWhenPreempted: a resync whose context has ended
// (a change is waiting) returns that context's error, which
// dataplane.Preempted recognizes, and writes nothing, even with drift
// to repair.
func TestKernelResyncStopsWhenPreempted(t *testing.T) {
	ns, conn := kernelNS(t)
	b := newBackend(t, ns)
	m := testModel()
	mustSync(t, b, dataplane.SyncRequest{Model: m, Full: true})
	table := serviceTableName(0)
	conn.FlushChain(&nftables.Chain{Name: chainServices, Table: &nftables.Table{Name: table, Family: nftables.TableFamilyIPv4}})
	if err := conn.Flush(); err != nil {
		t.Fatal(err)
	}
	flushed, _ := kernelView(t, ns, conn, ipv4)
	services := viewKey(table, chainServices)

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	req := dataplane.SyncRequest{Model: m, Full: true, Resync: true}
	_, err := b.Sync(ctx, req)
	if !errors.Is(err, context.Canceled) || !dataplane.Preempted(ctx, req, err) {
		t.Fatalf("preempted resync returned %v; want the context's error", err)
	}
	if got, _ := kernelView(t, ns, conn, ipv4); got.chains[services] != flushed.chains[services] {
		t.Errorf("a preempted resync wrote: %s holds %q, was %q", services, got.chains[services], flushed.chains[services])
	}
	// The next resync, not preempted, repairs it.
	mustSync(t, b, req)
	assertProgrammed(t, ns, conn, m, b)
}

// TestResyncRewritesWhenNeeded: a periodic resync rewrites the tables,
// whatever the kernel holds, when a port waits for a shared key;
// otherwise it only verifies.
func TestResyncRewritesWhenNeeded(t *testing.T) {
	ts, _ := render(ipv4, dt.ManyPorts(40, 2), newNodePolicy(ipv4, testConfig))
	if why := rewriteReason(ts); why != "" {
		t.Errorf("fresh rendering: %q; want no reason to rewrite", why)
	}
	ts.main().contested = true
	if rewriteReason(ts) == "" {
		t.Error("a contested key: want a rewrite")
	}
}

// TestKernelVerifyGoesOnWhereItStopped: a verification preempted by a
// change keeps what it verified (a set verified before the damage is not
// read again by the next attempt, which ends there and starts the one
// after it afresh), so that a verification longer than the time between
// two changes still ends.
func TestKernelVerifyGoesOnWhereItStopped(t *testing.T) {
	ns, conn := kernelNS(t)
	b := newBackend(t, ns)
	m := testModel()
	mustSync(t, b, dataplane.SyncRequest{Model: m, Full: true})
	st := b.state[ipv4]

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := b.verify(ctx, ipv4, st); !errors.Is(err, context.Canceled) {
		t.Fatalf("verify with an ended context: %v", err)
	}
	// As if a first attempt had got past service-ips of web's service
	// table before a change.
	web := model.ServicePortName{Namespace: "default", Name: "web", Port: "http", Protocol: corev1.ProtocolTCP}
	i := 1 + namesFor(web).table
	st.verified = verifyProgress{table: i, chains: true, set: mapServiceIPs}
	s := &nftables.Set{Name: mapServiceIPs, Table: &nftables.Table{Name: st.ts[i].name, Family: nftables.TableFamilyIPv4}, IsMap: true}
	elems, err := conn.GetSetElements(s)
	if err != nil || len(elems) == 0 {
		t.Fatalf("service-ips: %v, %v", elems, err)
	}
	if err := conn.SetDeleteElements(s, elems[:1]); err != nil {
		t.Fatal(err)
	}
	if err := conn.Flush(); err != nil {
		t.Fatal(err)
	}
	if why, err := b.verify(context.Background(), ipv4, st); err != nil || why != "" {
		t.Fatalf("going on after service-ips: %q, %v; want no difference (the damage is behind)", why, err)
	}
	if st.verified != (verifyProgress{}) {
		t.Fatalf("progress after a finished verification: %+v; want none", st.verified)
	}
	if why, err := b.verify(context.Background(), ipv4, st); err != nil || why == "" {
		t.Fatalf("a fresh verification: %q, %v; want the deleted element found", why, err)
	}
}

// TestKernelResyncTrustsAQuietGeneration: a full sync that nothing else
// committed beside, and a resync that verified every family, record the
// ruleset generation; the backend's own commits move it on; while
// nothing else commits, the next resync has nothing to read. Any other
// commit (damage to our table, or another program's table) moves the
// generation, and the next resync verifies again and repairs.
func TestKernelResyncTrustsAQuietGeneration(t *testing.T) {
	ns, conn := kernelNS(t)
	b := newBackend(t, ns)
	m := testModel()
	resync := dataplane.SyncRequest{Model: m, Full: true, Resync: true}
	mustSync(t, b, dataplane.SyncRequest{Model: m, Full: true})
	if !b.genKnown || b.gen != generation(t, ns) {
		t.Fatalf("after a full sync alone: known %v, gen %d; kernel %d", b.genKnown, b.gen, generation(t, ns))
	}
	conn.AddTable(&nftables.Table{Name: "before", Family: nftables.TableFamilyINet})
	if err := conn.Flush(); err != nil {
		t.Fatal(err)
	}
	mustSync(t, b, resync)
	if !b.genKnown || b.gen != generation(t, ns) {
		t.Fatalf("after a clean resync: known %v, gen %d; kernel %d", b.genKnown, b.gen, generation(t, ns))
	}
	web := model.ServicePortName{Namespace: "default", Name: "web", Port: "http", Protocol: corev1.ProtocolTCP}
	m.Ports[corev1.IPv4Protocol][web] = dt.Svc("default", "web", "http", "10.96.0.10", 80, dt.EP("10.244.1.2", 8080))
	mustSync(t, b, dataplane.SyncRequest{Model: m, Changed: model.ChangeSet{web: {}}})
	if !b.genKnown || b.gen != generation(t, ns) {
		t.Fatalf("after an incremental sync of ours: known %v, gen %d; kernel %d", b.genKnown, b.gen, generation(t, ns))
	}

	// Damage: the generation moves, the resync finds and repairs it.
	v4 := &nftables.Table{Name: serviceTableName(namesFor(web).table), Family: nftables.TableFamilyIPv4}
	conn.FlushChain(&nftables.Chain{Name: chainServices, Table: v4})
	if err := conn.Flush(); err != nil {
		t.Fatal(err)
	}
	mustSync(t, b, resync)
	assertProgrammed(t, ns, conn, m, b)

	// Another program's table: verified again, trusted again.
	mustSync(t, b, resync)
	conn.AddTable(&nftables.Table{Name: "other", Family: nftables.TableFamilyINet})
	if err := conn.Flush(); err != nil {
		t.Fatal(err)
	}
	if gen := generation(t, ns); gen == b.gen {
		t.Fatal("another program's commit did not move the generation")
	}
	mustSync(t, b, resync)
	if !b.genKnown || b.gen != generation(t, ns) {
		t.Fatalf("after verifying again: known %v, gen %d; kernel %d", b.genKnown, b.gen, generation(t, ns))
	}
	assertProgrammed(t, ns, conn, m, b)
}
