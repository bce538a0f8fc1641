package plan

import (
	"fmt"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
)

func dryRun(on bool) func(*v1alpha1.ProxyConfig) {
	return func(c *v1alpha1.ProxyConfig) { c.Spec.Rollout.DryRun = on }
}

// flatten lists a plan's node names batch by batch, and the batch each
// node is in.
func flatten(pl *v1alpha1.RolloutPlan) ([]string, map[string]int) {
	var order []string
	batch := map[string]int{}
	for i, b := range pl.Batches {
		for _, n := range b.Nodes {
			order = append(order, n)
			batch[n] = i
		}
	}
	return order, batch
}

// The dry run writes no node and publishes the plan; clearing dryRun then
// moves the nodes in exactly that order and those batches.
func TestDryRunPlanIsTheRollout(t *testing.T) {
	s := newSim(t, 10, v1alpha1.ModeNFTables, maxU(intstr.FromInt32(3)), canary(2, ""), dryRun(true))
	s.run(50, s.phaseIs("pc", v1alpha1.RolloutPlanned))
	s.steps(20) // a dry run stays a dry run
	st := s.cfg("pc").Status
	if len(s.specLog) != 0 || s.hasEvent(EventRolloutStarted) || st.StartTime != nil {
		t.Fatalf("a dry run changed nodes: %v, events %v, start %v", s.specLog, s.eventReasons(), st.StartTime)
	}
	pl := st.Plan
	if pl == nil || st.Phase != v1alpha1.RolloutPlanned {
		t.Fatalf("phase %s plan %+v", st.Phase, pl)
	}
	want := "[{true 2 [node-00 node-01]} {false 3 [node-02 node-03 node-04]} {false 3 [node-05 node-06 node-07]} {false 2 [node-08 node-09]}]"
	if got := fmt.Sprint(pl.Batches); got != want || pl.Nodes != 10 || pl.BatchCount != 4 || pl.MaxUnavailable != 3 || pl.Mode != v1alpha1.ModeNFTables {
		t.Fatalf("plan %+v\nbatches %s, want %s", pl, got, want)
	}
	if pf := pl.Preflight; pf.Passed != 10 || pf.Blocked+pf.Waiting != 0 || len(pf.Problems) != 0 {
		t.Errorf("preflight %+v", pl.Preflight)
	}
	if c := s.cond("pc", v1alpha1.ConditionProgressing); c.Status != metav1.ConditionFalse || c.Reason != ReasonDryRun ||
		!strings.Contains(c.Message, "would move 10 nodes to nftables in 4 batches, node-00, node-01 first as the canary") {
		t.Errorf("Progressing %+v", c)
	}

	order, batchOf := flatten(pl)
	s.edit("pc", dryRun(false))
	// Record at which step each node was moved: nodes of one batch move
	// together, a batch after the one before it.
	movedAt := map[string]int{}
	s.run(300, func() bool {
		for _, e := range s.specLog {
			name := strings.SplitN(e, "=", 2)[0]
			if _, ok := movedAt[name]; !ok {
				movedAt[name] = s.step
			}
		}
		return s.cfg("pc").Status.Phase == v1alpha1.RolloutCompleted
	})
	var moved []string
	for _, e := range s.specLog {
		moved = append(moved, strings.TrimSuffix(e, "=nftables"))
	}
	if strings.Join(moved, ",") != strings.Join(order, ",") {
		t.Fatalf("moved in order %v, the plan said %v", moved, order)
	}
	for _, a := range order {
		for _, b := range order {
			if (batchOf[a] == batchOf[b]) != (movedAt[a] == movedAt[b]) || (batchOf[a] < batchOf[b]) != (movedAt[a] < movedAt[b]) {
				t.Fatalf("%s (batch %d, step %d) and %s (batch %d, step %d) did not move as planned", a, batchOf[a], movedAt[a], b, batchOf[b], movedAt[b])
			}
		}
	}
	if s.cfg("pc").Status.Plan != nil {
		t.Errorf("plan left in status after the dry run: %+v", s.cfg("pc").Status.Plan)
	}
}

// Nodes that cannot run the mode are in the plan's preflight, not in its
// batches, and the plan is still published.
func TestDryRunPreflight(t *testing.T) {
	s := newSim(t, 4, v1alpha1.ModeIPVS, dryRun(true))
	s.agents["node-02"].facts = noIPVS()
	s.agents["node-03"].facts = nil // never reports
	s.steps(3)
	st := s.cfg("pc").Status
	if st.Phase != v1alpha1.RolloutPlanned || st.Plan == nil {
		t.Fatalf("phase %s plan %+v", st.Phase, st.Plan)
	}
	pf := st.Plan.Preflight
	if pf.Passed != 2 || pf.Blocked != 1 || pf.Waiting != 1 || len(pf.Problems) != 2 ||
		pf.Problems[0].Name != "node-02" || pf.Problems[0].Outcome != v1alpha1.PreflightBlocked || !strings.Contains(pf.Problems[0].Reason, "ip_vs") ||
		pf.Problems[1].Name != "node-03" || pf.Problems[1].Outcome != v1alpha1.PreflightWaiting {
		t.Fatalf("preflight %+v", pf)
	}
	if got := fmt.Sprint(st.Plan.Batches); got != "[{true 1 [node-00]} {false 1 [node-01]}]" {
		t.Errorf("batches %s", got)
	}
	if c := s.cond("pc", v1alpha1.ConditionDegraded); c.Status != metav1.ConditionTrue || c.Reason != ReasonPreflightFailed {
		t.Errorf("Degraded %+v", c)
	}
	if len(s.specLog) != 0 {
		t.Errorf("a dry run moved nodes: %v", s.specLog)
	}
}

// Setting dryRun mid-rollout lets moving nodes finish, starts no other,
// and plans the rest.
func TestDryRunMidRollout(t *testing.T) {
	s := newSim(t, 6, v1alpha1.ModeNFTables, maxU(intstr.FromInt32(2)))
	s.run(100, func() bool { return len(s.specLog) >= 3 })
	s.edit("pc", dryRun(true))
	s.steps(30)
	st := s.cfg("pc").Status
	if len(s.specLog) != 3 || st.Phase != v1alpha1.RolloutPlanned {
		t.Fatalf("moves %v phase %s", s.specLog, st.Phase)
	}
	if got := fmt.Sprint(st.Plan.Batches); got != "[{false 2 [node-03 node-04]} {false 1 [node-05]}]" || st.Nodes.Updated != 3 {
		t.Fatalf("batches %s, nodes %+v", got, st.Nodes)
	}
	s.edit("pc", dryRun(false))
	s.run(200, s.phaseIs("pc", v1alpha1.RolloutCompleted))
	if got := strings.Join(s.specLog, ","); !strings.HasSuffix(got, "node-03=nftables,node-04=nftables,node-05=nftables") {
		t.Errorf("moves %s", got)
	}
}

// Big clusters: the plan's lists are bounded, its counts exact.
func TestDryRunBounded(t *testing.T) {
	s := newSim(t, 300, v1alpha1.ModeNFTables, maxU(intstr.FromInt32(2)), dryRun(true))
	s.steps(3)
	pl := s.cfg("pc").Status.Plan
	named := 0
	for _, b := range pl.Batches {
		named += len(b.Nodes)
	}
	if pl.Nodes != 300 || pl.BatchCount != 151 || len(pl.Batches) != v1alpha1.MaxPlanBatches || named != 99 {
		t.Fatalf("nodes %d batches %d listed %d named %d", pl.Nodes, pl.BatchCount, len(pl.Batches), named)
	}
}
