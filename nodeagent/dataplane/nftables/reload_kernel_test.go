package nftables

import (
	"context"
	"strings"
	"testing"

	"github.com/proxyshift/proxyshift/nodeagent/dataplane"
	dt "github.com/proxyshift/proxyshift/nodeagent/dataplane/dataplanetest"
	"github.com/proxyshift/proxyshift/nodeagent/dataplane/internal/nft/nfttest"
	"github.com/proxyshift/proxyshift/test/netlab"
)

// TestListingLoadsBack checks that what `nft list table` shows of every
// golden table can be loaded back with `nft -f`, as a ruleset saved with
// `nft list ruleset` is at boot, that it then lists the same, and that an
// agent starting on the node takes the loaded table over as its own.
func TestListingLoadsBack(t *testing.T) {
	for _, sc := range dt.Scenarios() {
		t.Run(sc.Name, func(t *testing.T) {
			listed, tables := programScenario(t, sc)
			other := loadListing(t, listed)
			nfttest.Equal(t, "loaded back", listTables(t, other, familyOf(sc.Family), tables), listed)
			checkTakenOver(t, sc, other)
		})
	}
}

// TestFullSyncDescribesOldMaps: a map of numgen keys (ClientIP
// affinity's) that does not carry nft's description of it (made by an
// agent before it wrote one, listed as "type 0"; here one that describes
// another modulus) is made anew by the next full sync, so the listing of
// an upgraded node loads back too.
func TestFullSyncDescribesOldMaps(t *testing.T) {
	for _, sc := range dt.Scenarios() {
		if sc.Name != "affinity" {
			continue
		}
		t.Run(sc.Name, func(t *testing.T) {
			listed, _ := programScenario(t, sc)
			old := strings.ReplaceAll(listed, "typeof numgen random mod 65536 :", "typeof numgen random mod 4096 :")
			if old == listed {
				t.Fatal("the listing has no map of numgen keys")
			}
			checkTakenOver(t, sc, loadListing(t, old))
		})
	}
}

// programScenario programs scenario sc's tables into a namespace of its
// own and returns nft's listing of the main table and of the service
// tables that hold a port's objects (as tables.String dumps them), and
// their names.
func programScenario(t *testing.T, sc dt.Scenario) (listing string, tables []string) {
	t.Helper()
	ns, _ := kernelNS(t)
	b, err := New(sc.Config, WithNetNS(ns.NS()))
	if err != nil {
		t.Fatal(err)
	}
	mustSync(t, b, dataplane.SyncRequest{Model: dt.Snapshot(sc.Ports...), Full: true})
	f := familyOf(sc.Family)
	for i, rs := range b.state[f].ts {
		if i == 0 || rs.holdsPorts() {
			tables = append(tables, rs.name)
		}
	}
	return listTables(t, ns, f, tables), tables
}

// listTables is nft's listing of tables of family f in ns, one after the
// other as tables.String dumps them.
func listTables(t *testing.T, ns *netlab.NetNS, f *family, tables []string) string {
	t.Helper()
	var listings []string
	for _, name := range tables {
		listings = append(listings, nfttest.List(t, ns.NS(), f.Name, name))
	}
	return strings.Join(listings, "\n")
}

// loadListing loads a listing with `nft -f` into a new namespace.
func loadListing(t *testing.T, listing string) *netlab.NetNS {
	t.Helper()
	ns := netlab.NewNetNS(t, "nftload")
	if out, err := ns.NS().Output(context.Background(), []byte(listing), "nft", "-f", "-"); err != nil {
		t.Fatalf("nft -f of the listing: %v\n%s", err, out)
	}
	return ns
}

// checkTakenOver starts a backend in ns, as an agent starting on a node
// whose table was loaded with nft -f, and checks that its first (full)
// sync leaves the kernel holding its dump.
func checkTakenOver(t *testing.T, sc dt.Scenario, ns *netlab.NetNS) {
	t.Helper()
	b, err := New(sc.Config, WithNetNS(ns.NS()))
	if err != nil {
		t.Fatal(err)
	}
	mustSync(t, b, dataplane.SyncRequest{Model: dt.Snapshot(sc.Ports...), Full: true})
	f := familyOf(sc.Family)
	for _, rs := range b.state[f].ts {
		nfttest.Equal(t, "taken over, "+rs.name, nfttest.List(t, ns.NS(), f.Name, rs.name), rs.String())
	}
}
