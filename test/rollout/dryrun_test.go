package rollout

import (
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
	"github.com/proxyshift/proxyshift/plugin"
)

// TestDryRunThenStartThenRollBack: the operator publishes a dry run's
// plan through the real API server and writes no node; clearing dryRun
// moves the nodes in the plan's order; the plugin's rollback then moves
// them back through a normal rollout, the canary first.
func TestDryRunThenStartThenRollBack(t *testing.T) {
	w := newWorld(t)
	nodes := w.createNodes("node", 7, pool)
	w.rec.track("pc", nodes, 2)
	w.startOperator(opOptions{})
	cfg := newConfig("pc", v1alpha1.ModeNFTables, intstr.FromInt32(2))
	cfg.Spec.Rollout.DryRun = true
	w.create(cfg)

	c := w.waitPhase("pc", v1alpha1.RolloutPlanned, 60*time.Second)
	w.waitFor("a plan of every node", 30*time.Second, func() bool {
		c = w.config("pc")
		return c.Status.Plan != nil && c.Status.Plan.Nodes == 7
	})
	time.Sleep(2 * time.Second) // a dry run stays one
	if got := w.rec.specChanges(); len(got) != 0 {
		t.Fatalf("a dry run wrote node specs: %v", got)
	}
	// The plan's batches, each sorted: nodes of one batch start together,
	// in no particular order among themselves.
	var planned []string
	var sizes []int
	for _, b := range c.Status.Plan.Batches {
		batch := []string{}
		for _, n := range b.Nodes {
			batch = append(batch, n+"=nftables")
		}
		slices.Sort(batch)
		planned = append(planned, batch...)
		sizes = append(sizes, len(batch))
	}
	// byBatch sorts moves within each of the plan's batches.
	byBatch := func(moves []string) []string {
		out := slices.Clone(moves)
		at := 0
		for _, n := range sizes {
			if at+n > len(out) {
				break
			}
			slices.Sort(out[at : at+n])
			at += n
		}
		return out
	}
	if pl := c.Status.Plan; pl.BatchCount != 4 || !pl.Batches[0].Canary || len(pl.Batches[0].Nodes) != 1 || pl.Preflight.Passed != 7 {
		t.Fatalf("plan %+v", pl)
	}

	w.edit("pc", func(c *v1alpha1.ProxyConfig) { c.Spec.Rollout.DryRun = false })
	c = w.waitPhase("pc", v1alpha1.RolloutCompleted, 60*time.Second)
	if got := w.rec.specChanges(); strings.Join(byBatch(got), ",") != strings.Join(planned, ",") {
		t.Fatalf("nodes moved in order %v, the plan's batches said %v", got, planned)
	}
	if c.Status.Plan != nil {
		t.Errorf("plan left in status: %+v", c.Status.Plan)
	}

	var pns v1alpha1.ProxyNodeList
	if err := w.c.List(w.ctx, &pns); err != nil {
		t.Fatal(err)
	}
	spec, moved, err := plugin.RollbackSpec(c, pns.Items)
	if err != nil || moved != 7 || spec.Mode != v1alpha1.ModeIPTables {
		t.Fatalf("rollback spec %+v, %d nodes, %v", spec, moved, err)
	}
	c.Spec = spec
	if err := w.c.Update(w.ctx, c, &client.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	w.waitFor("the rollback rollout to complete", 60*time.Second, func() bool {
		c = w.config("pc")
		return c.Status.ObservedGeneration == c.Generation && c.Status.Phase == v1alpha1.RolloutCompleted
	})
	back := w.rec.specChanges()[7:]
	if len(back) != 7 || back[0] != "node-00=iptables" {
		t.Errorf("rollback moves %v, want every node back to iptables, node-00 (the canary) first", back)
	}
	for _, n := range nodes {
		if pn := w.proxyNode(n); pn.Status.ActiveMode != v1alpha1.ModeIPTables {
			t.Errorf("%s runs %s after the rollback", n, pn.Status.ActiveMode)
		}
	}
	if max := w.rec.check(t)["pc"]; max > 2 {
		t.Errorf("%d nodes moved at once, maxUnavailable 2", max)
	}
}
