package cleanup

import (
	"context"
	"strings"
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	corev1 "k8s.io/api/core/v1"

	"github.com/proxyshift/proxyshift/nodeagent/dataplane"
	dt "github.com/proxyshift/proxyshift/nodeagent/dataplane/dataplanetest"
	nftbackend "github.com/proxyshift/proxyshift/nodeagent/dataplane/nftables"
	"github.com/proxyshift/proxyshift/nodeagent/model"
	"github.com/proxyshift/proxyshift/test/netlab"
)

// TestKernelRemoveLeavesForeignTable: --cleanup removes the table
// proxyshift made, and leaves, byte for byte, a table of the same name
// another program made, saying so.
func TestKernelRemoveLeavesForeignTable(t *testing.T) {
	netlab.RequireRoot(t)
	ns := netlab.NewNetNS(t, "cleanup")
	ctx := context.Background()
	conn, err := nftables.New(nftables.WithNetNSFd(ns.FD()))
	if err != nil {
		t.Fatal(err)
	}
	theirs := conn.AddTable(&nftables.Table{Name: nftbackend.TableName, Family: nftables.TableFamilyIPv4})
	ch := conn.AddChain(&nftables.Chain{Name: "theirs", Table: theirs})
	conn.AddRule(&nftables.Rule{Table: theirs, Chain: ch, Exprs: []expr.Any{&expr.Counter{}}})
	if err := conn.Flush(); err != nil {
		t.Fatal(err)
	}
	list := func() string {
		out, err := ns.NS().Output(ctx, nil, "nft", "list", "table", "ip", nftbackend.TableName)
		if err != nil {
			t.Fatalf("nft list table: %v", err)
		}
		return string(out)
	}
	before := list()

	b, err := nftbackend.New(dataplane.NodeConfig{MasqueradeBit: 14}, nftbackend.WithNetNS(ns.NS()))
	if err != nil {
		t.Fatal(err)
	}
	v6 := dt.PortsOf(dt.Svc("default", "web", "http", "fd00:10:96::10", 80, dt.EP("fd00:10:244:1::2", 8080)))
	if _, err := b.Sync(ctx, dataplane.SyncRequest{Full: true, Model: &model.Snapshot{Ports: map[corev1.IPFamily]map[model.ServicePortName]*model.ServicePort{corev1.IPv6Protocol: v6}}}); err != nil {
		t.Fatal(err)
	}

	sw := &Sweeper{NS: ns.NS()}
	lines, err := sw.Remove(ctx, Proxyshift)
	if err == nil || !strings.Contains(err.Error(), "nftables table ip proxyshift was not created by proxyshift") {
		t.Errorf("Remove: %v; want an error naming the foreign table", err)
	}
	if got := strings.Join(lines, "\n"); !strings.Contains(got, "nftables table ip6 proxyshift") || strings.Contains(got, "table ip proxyshift") {
		t.Errorf("Remove removed\n%s\nwant proxyshift's ip6 table only", got)
	}
	if after := list(); after != before {
		t.Errorf("the foreign table changed:\n%s\nwas\n%s", after, before)
	}
	if present, err := sw.Present(ctx, Proxyshift); err != nil || present {
		t.Errorf("Present with only the foreign table left: %v, %v; want false", present, err)
	}
}
