package plugin

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/utils/ptr"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
	"github.com/proxyshift/proxyshift/controllers/plan"
	"github.com/proxyshift/proxyshift/test/testenv"
)

// TestPlanAndRollback runs `plan` and `rollback` against a real API
// server (its CRD schema and validation rules included), playing the
// operator's part by writing the status it would write.
func TestPlanAndRollback(t *testing.T) {
	env := testenv.Start(t)
	ctx := context.Background()
	c := env.Client
	run := func(t *testing.T, args ...string) (string, error) {
		t.Helper()
		var out bytes.Buffer
		cmd := newCommand(genericiooptions.IOStreams{Out: &out, ErrOut: &out}, time.Now)
		cmd.SetArgs(append(args, "--kubeconfig", env.Kubeconfig))
		err := cmd.ExecuteContext(ctx)
		return out.String(), err
	}
	get := func(t *testing.T) *v1alpha1.ProxyConfig {
		t.Helper()
		got := &v1alpha1.ProxyConfig{}
		if err := c.Get(ctx, types.NamespacedName{Name: "to-ipvs"}, got); err != nil {
			t.Fatal(err)
		}
		return got
	}

	cfg := &v1alpha1.ProxyConfig{ObjectMeta: metav1.ObjectMeta{Name: "to-ipvs"}, Spec: v1alpha1.ProxyConfigSpec{
		Mode: v1alpha1.ModeIPVS,
		ProxySettings: v1alpha1.ProxySettings{IPVS: &v1alpha1.IPVSSettings{Scheduler: "rr"},
			ClusterCIDRs: []v1alpha1.CIDR{"198.18.0.0/16"}},
		Rollout: v1alpha1.RolloutPolicy{Canary: v1alpha1.CanaryPolicy{Nodes: ptr.To[int32](1)}},
	}}
	if err := c.Create(ctx, cfg); err != nil {
		t.Fatal(err)
	}

	t.Run("plan without a dry run", func(t *testing.T) {
		out, err := run(t, "plan", "to-ipvs")
		if err != nil || !strings.Contains(out, "has no plan: spec.rollout.dryRun is not set; `kubectl proxyshift plan to-ipvs --request` asks for one") {
			t.Errorf("%v %q", err, out)
		}
	})
	t.Run("plan --request", func(t *testing.T) {
		done := make(chan error, 1)
		var out bytes.Buffer
		go func() {
			cmd := newCommand(genericiooptions.IOStreams{Out: &out, ErrOut: &out}, time.Now)
			cmd.SetArgs([]string{"plan", "to-ipvs", "--request", "--kubeconfig", env.Kubeconfig})
			done <- cmd.ExecuteContext(ctx)
		}()
		// The operator's part: see dryRun, publish the plan.
		var got *v1alpha1.ProxyConfig
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			if got = get(t); got.Spec.Rollout.DryRun {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("plan --request did not set spec.rollout.dryRun")
			}
		}
		got.Status = v1alpha1.ProxyConfigStatus{ObservedGeneration: got.Generation, Phase: v1alpha1.RolloutPlanned, TargetMode: v1alpha1.ModeIPVS,
			Plan: &v1alpha1.RolloutPlan{Mode: v1alpha1.ModeIPVS, MaxUnavailable: 2, Nodes: 5, BatchCount: 3,
				Batches: []v1alpha1.PlanBatch{
					{Canary: true, Count: 1, Nodes: []string{"node-a"}},
					{Count: 2, Nodes: []string{"node-b", "node-c"}},
					{Count: 2, Nodes: []string{"node-d"}}, // a name cut by the bound
				},
				Preflight: v1alpha1.PlanPreflight{Passed: 5, Blocked: 1, Waiting: 1, Problems: []v1alpha1.PlanProblem{
					{Name: "node-x", Outcome: v1alpha1.PreflightBlocked, Reason: "cannot run ipvs: kernel module ip_vs is missing"},
					{Name: "node-y", Outcome: v1alpha1.PreflightWaiting, Reason: "its agent has not reported kernel facts yet"},
				}},
			},
			Conditions: []metav1.Condition{
				{Type: v1alpha1.ConditionProgressing, Status: metav1.ConditionFalse, Reason: plan.ReasonDryRun, LastTransitionTime: metav1.Now(),
					Message: "spec.rollout.dryRun is set: the rollout would move 5 nodes to ipvs in 3 batches, node-a first as the canary; no node was changed: clear spec.rollout.dryRun to start"},
				{Type: v1alpha1.ConditionDegraded, Status: metav1.ConditionTrue, Reason: plan.ReasonPreflightFailed, LastTransitionTime: metav1.Now(),
					Message: "1 nodes cannot run ipvs (node-x: cannot run ipvs: kernel module ip_vs is missing)"},
			},
		}
		if err := c.Status().Update(ctx, got); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatalf("plan --request: %v\n%s", err, out.String())
		}
		golden(t, "plan.txt", out.String())
		again, err := run(t, "plan", "to-ipvs")
		if err != nil || again != out.String() {
			t.Errorf("plan without --request: %v\n%s\nwant what --request printed", err, again)
		}
	})
	t.Run("plan -o json", func(t *testing.T) {
		out, err := run(t, "plan", "to-ipvs", "-o", "json")
		if err != nil {
			t.Fatal(err)
		}
		var list struct {
			Items []v1alpha1.ProxyConfig
		}
		if err := json.Unmarshal([]byte(out), &list); err != nil {
			t.Fatal(err)
		}
		if len(list.Items) != 1 || list.Items[0].Status.Plan == nil || list.Items[0].Status.Plan.Batches[1].Nodes[1] != "node-c" {
			t.Errorf("-o json: %s", out)
		}
	})
	t.Run("plan --start", func(t *testing.T) {
		out, err := run(t, "plan", "to-ipvs", "--start")
		if err != nil || out != "proxyconfig/to-ipvs started: spec.rollout.dryRun cleared\n" || get(t).Spec.Rollout.DryRun {
			t.Errorf("%v %q dryRun %v", err, out, get(t).Spec.Rollout.DryRun)
		}
	})
	t.Run("plan --request times out without an operator", func(t *testing.T) {
		_, err := run(t, "plan", "to-ipvs", "--request", "--timeout", "300ms")
		if err == nil || !strings.Contains(err.Error(), "the operator published no plan within 300ms") {
			t.Errorf("%v", err)
		}
		if _, err := run(t, "plan", "to-ipvs", "--start"); err != nil {
			t.Fatal(err)
		}
	})

	// The rollout ran: it moved node-a and node-b from iptables (run with
	// settings from an earlier config) and sent node-c back already;
	// node-d belongs to another rollout.
	start := metav1.NewTime(time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC))
	got := get(t)
	got.Status = v1alpha1.ProxyConfigStatus{ObservedGeneration: got.Generation, Phase: v1alpha1.RolloutProgressing, TargetMode: v1alpha1.ModeIPVS, StartTime: &start}
	if err := c.Status().Update(ctx, got); err != nil {
		t.Fatal(err)
	}
	rid := plan.RolloutID("to-ipvs", start.Time)
	prevSettings := `{"iptables":{"masqueradeBit":14,"minSyncPeriod":"1s"},"clusterCIDRs":["198.19.0.0/16"]}`
	for name, ann := range map[string]map[string]string{
		"node-a": {plan.AnnotationRollout: rid, plan.AnnotationPreviousMode: "iptables", plan.AnnotationPreviousSettings: prevSettings},
		"node-b": {plan.AnnotationRollout: rid, plan.AnnotationPreviousMode: "iptables", plan.AnnotationPreviousSettings: prevSettings},
		"node-c": {plan.AnnotationRollout: rid, plan.AnnotationRolledBack: rid, plan.AnnotationPreviousMode: "nftables"},
		"node-d": {plan.AnnotationRollout: "other@2026-01-01T00:00:00Z", plan.AnnotationPreviousMode: "nftables"},
	} {
		if err := c.Create(ctx, &v1alpha1.ProxyNode{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: ann}}); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("rollback", func(t *testing.T) {
		out, err := run(t, "rollback", "to-ipvs", "--plan-only")
		if err != nil {
			t.Fatal(err)
		}
		golden(t, "rollback.txt", out)
		after := get(t)
		s := after.Spec
		if s.Mode != v1alpha1.ModeIPTables || s.IPVS != nil || s.IPTables == nil || s.IPTables.MinSyncPeriod != "1s" ||
			len(s.ClusterCIDRs) != 1 || s.ClusterCIDRs[0] != "198.19.0.0/16" || !s.Rollout.DryRun ||
			s.Rollout.Canary.Nodes == nil || *s.Rollout.Canary.Nodes != 1 || after.Generation == got.Generation {
			t.Errorf("spec after rollback: %+v", s)
		}
		// Nothing more to roll back: the spec asks for the previous mode.
		if _, err := run(t, "rollback", "to-ipvs", "-o", "yaml"); err == nil || !strings.Contains(err.Error(), "spec.mode is iptables already") {
			t.Errorf("second rollback: %v", err)
		}
	})
}
