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
			ns, _ := kernelNS(t)
			b, err := New(sc.Config, WithNetNS(ns.NS()))
			if err != nil {
				t.Fatal(err)
			}
			mustSync(t, b, dataplane.SyncRequest{Model: dt.Snapshot(sc.Ports...), Full: true})
			family := familyOf(sc.Family).Name
			listed := nfttest.List(t, ns.NS(), family, TableName)
			other := netlab.NewNetNS(t, "nftload")
			if out, err := other.NS().Output(context.Background(), []byte(listed), "nft", "-f", "-"); err != nil {
				t.Fatalf("nft -f of the listing: %v\n%s", err, out)
			}
			nfttest.Equal(t, "loaded back", nfttest.List(t, other.NS(), family, TableName), listed)
			next, err := New(sc.Config, WithNetNS(other.NS()))
			if err != nil {
				t.Fatal(err)
			}
			mustSync(t, next, dataplane.SyncRequest{Model: dt.Snapshot(sc.Ports...), Full: true})
			nfttest.Equal(t, "taken over", nfttest.List(t, other.NS(), family, TableName), next.state[familyOf(sc.Family)].rs.String())
		})
	}
}

// TestFullSyncDescribesOldMaps: a map of numgen keys that does not carry
// nft's description of it (made by an agent before it wrote one, listed
// as "type 0"; here one that says its keys are marks) is made anew by
// the next full sync, so the listing of an upgraded node loads back too.
func TestFullSyncDescribesOldMaps(t *testing.T) {
	for _, sc := range dt.Scenarios() {
		if sc.Name != "clusterip" && sc.Name != "affinity" {
			continue
		}
		t.Run(sc.Name, func(t *testing.T) {
			ns, _ := kernelNS(t)
			b, err := New(sc.Config, WithNetNS(ns.NS()))
			if err != nil {
				t.Fatal(err)
			}
			mustSync(t, b, dataplane.SyncRequest{Model: dt.Snapshot(sc.Ports...), Full: true})
			family := familyOf(sc.Family).Name
			listed := nfttest.List(t, ns.NS(), family, TableName)
			old := strings.ReplaceAll(listed, "typeof numgen random mod 65536 :", "typeof numgen random mod 4096 :")
			if old == listed {
				t.Fatal("the listing has no map of numgen keys")
			}
			other := netlab.NewNetNS(t, "nftold")
			if out, err := other.NS().Output(context.Background(), []byte(old), "nft", "-f", "-"); err != nil {
				t.Fatalf("nft -f: %v\n%s", err, out)
			}
			next, err := New(sc.Config, WithNetNS(other.NS()))
			if err != nil {
				t.Fatal(err)
			}
			mustSync(t, next, dataplane.SyncRequest{Model: dt.Snapshot(sc.Ports...), Full: true})
			nfttest.Equal(t, "after a full sync", nfttest.List(t, other.NS(), family, TableName), next.state[familyOf(sc.Family)].rs.String())
		})
	}
}
