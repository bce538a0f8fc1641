package ipvs

import (
	"maps"
	"testing"

	"github.com/google/nftables"

	dt "github.com/proxyshift/proxyshift/nodeagent/dataplane/dataplanetest"
	"github.com/proxyshift/proxyshift/nodeagent/dataplane/internal/nft"
	"github.com/proxyshift/proxyshift/nodeagent/dataplane/internal/nft/nfttest"
	"github.com/proxyshift/proxyshift/nodeagent/model"
	"github.com/proxyshift/proxyshift/test/netlab"
)

// The helper table needs nf_tables only, which kernels without IPVS may
// have: these tests run wherever the test runs as root, in a namespace
// of their own, and read the table back through google/nftables.

// tableNS returns a fresh namespace and a kernel session that can only
// reach its helper tables (no IPVS, no rtnetlink).
func tableNS(t *testing.T) (*netlab.NetNS, *kernel) {
	t.Helper()
	netlab.RequireRoot(t)
	ns := netlab.NewNetNS(t, "ipvs-table")
	conn, err := nftables.New(nftables.WithNetNSFd(ns.FD()))
	if err == nil {
		_, err = conn.ListTablesOfFamily(nftables.TableFamilyIPv4)
	}
	if err != nil {
		t.Skipf("needs nf_tables in the kernel (listing tables failed: %v)", err)
	}
	return ns, &kernel{netns: ns.NS()}
}

// commitTable writes a plan's helper-table part: the replacement of the
// table, or its element changes.
func commitTable(t *testing.T, b *kernel, f *family, st *familyState, p *plan) {
	t.Helper()
	var err error
	if p.replace {
		err = b.writeTable(func(t *nft.Txn) error { return queueTable(t, f, st.chains, p.elems) })
	} else {
		del := append(p.preDel, p.postDel...)
		err = b.writeTable(func(t *nft.Txn) error { return queueElements(t, f, del, p.add) })
	}
	if err != nil {
		t.Fatalf("write the helper table: %v", err)
	}
}

// checkTable compares the kernel's helper table with the state.
func checkTable(t *testing.T, b *kernel, f *family, st *familyState) {
	t.Helper()
	tc, err := b.readTable(f, true)
	if err != nil {
		t.Fatal(err)
	}
	rules := 0
	for _, c := range st.chains {
		rules += len(c.Rules)
	}
	elems := st.elements()
	if tc.rules != rules || tc.elements != len(elems)+len(fixedElements()) {
		t.Errorf("kernel holds %d rules and %d elements; want %d and %d", tc.rules, tc.elements, rules, len(elems)+len(fixedElements()))
	}
	want := map[vsKey]string{}
	for k, name := range st.owners {
		want[k] = name.String()
	}
	if !maps.Equal(tc.records, want) {
		t.Errorf("records %v; want %v", tc.records, want)
	}
}

func TestHelperTableInKernel(t *testing.T) {
	ns, b := tableNS(t)
	for _, f := range families {
		t.Run(f.Name, func(t *testing.T) {
			rc := testRenderConfig(f, testConfig)
			base := baseModel()
			if f == ipv6 {
				base = dt.PortsOf(dt.Svc("default", "web", "http", "fd00:10:96::10", 80, dt.NodePort(30080), dt.LB("2001:db8:100::1"),
					dt.SourceRanges("2001:db8:200::/64"), dt.EP("fd00:10:244:1::2", 8080), dt.EP("fd00:10:244:2::3", 8080, dt.Local)))
			}
			st, _ := newState(rc, base, nil)
			commitTable(t, b, f, st, fullPlan(st, &kernelView{}))
			checkTable(t, b, f, st)
			t.Run("nft-lists-the-chains-of-the-dump", func(t *testing.T) {
				nfttest.EqualChains(t, f.Name, nfttest.List(t, ns.NS(), f.Name, TableName), dumpTable(f, st.chains))
			})

			// A second full sync replaces the table in place.
			commitTable(t, b, f, st, fullPlan(st, &kernelView{}))
			checkTable(t, b, f, st)

			// Incremental: the first port loses an endpoint and its
			// source ranges, the last (if another) is deleted.
			next := maps.Clone(base)
			names := model.SortedNames(base)
			c := *base[names[0]]
			c.Endpoints = c.Endpoints[:1]
			c.LoadBalancerSourceRanges = nil
			next[names[0]] = &c
			if len(names) > 1 {
				delete(next, names[len(names)-1])
			}
			changes, _ := changesFor(st, next, model.ChangeSet{names[0]: {}, names[len(names)-1]: {}})
			commitTable(t, b, f, st, incrementalPlan(st, changes))
			st.commit(changes)
			checkTable(t, b, f, st)
		})
	}
}

// TestHelperTableLarge writes the table of two thousand services of ten
// endpoints in one transaction: more than a netlink socket's default send
// buffer takes in one sendmsg.
func TestHelperTableLarge(t *testing.T) {
	_, b := tableNS(t)
	st, _ := newState(testRenderConfig(ipv4, testConfig), dt.BenchModel(2000).Ports[ipv4.Model], nil)
	commitTable(t, b, ipv4, st, fullPlan(st, &kernelView{}))
	checkTable(t, b, ipv4, st)
}
