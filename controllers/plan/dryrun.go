package plan

import (
	"fmt"
	"strings"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
	"github.com/proxyshift/proxyshift/internal/text"
)

// dryRun ends a pass with spec.rollout.dryRun set: nothing is written,
// and the plan of what the rollout would do next is published. pf is the
// preflight of the pending nodes and canaryLeft how many canary nodes are
// still to start; o holds what the pass decided so far.
func (p *pass) dryRun(pf checked, canaryLeft int, o outcome) outcome {
	o.plan = p.planOf(pf, canaryLeft, o.failed)
	o.phase, o.stage = v1alpha1.RolloutPlanned, ReasonDryRun
	msg := fmt.Sprintf("spec.rollout.dryRun is set: the rollout would move %d nodes to %s in %d batches", o.plan.Nodes, p.cfg.Spec.Mode, o.plan.BatchCount)
	if b := o.plan.Batches; len(b) > 0 && b[0].Canary {
		msg += fmt.Sprintf(", %s first as the canary", strings.Join(b[0].Nodes, ", "))
	}
	if left := len(pf.eligible) - int(o.plan.Nodes); left > 0 {
		msg += fmt.Sprintf("; %d more wait until failed nodes leave the maxUnavailable budget", left)
	}
	if len(pf.waiting) > 0 {
		msg += fmt.Sprintf("; %d nodes wait for their agent to report (%s)", len(pf.waiting), names(pf.waiting, 5))
	}
	o.stageMsg = msg + "; no node was changed: clear spec.rollout.dryRun to start"
	if len(pf.blocked) > 0 {
		o.degraded = ReasonPreflightFailed
		o.degMsg = fmt.Sprintf("%d nodes cannot run %s (%s); the rollout would leave them alone: fix the nodes or change spec.mode or spec.nodeSelector",
			len(pf.blocked), p.cfg.Spec.Mode, failedSummary(pf.blocked, o.failed))
	}
	return o
}

// planOf cuts the eligible nodes into the batches the rollout would start
// them in, with batchSize as the rollout does: first the canary (alone,
// and within the budget left by nodes in transition now), then, each
// after the one before settled, batches of maxUnavailable less the nodes
// that stay in transition.
func (p *pass) planOf(pf checked, canaryLeft int, failed map[string]failedEntry) *v1alpha1.RolloutPlan {
	pl := &v1alpha1.RolloutPlan{
		Mode:           p.cfg.Spec.Mode,
		MaxUnavailable: int32(p.maxUnav),
		Preflight: v1alpha1.PlanPreflight{
			Passed: int32(len(pf.eligible)), Blocked: int32(len(pf.blocked)), Waiting: int32(len(pf.waiting)),
		},
	}
	// Nodes in transition that the plan does not move stay unavailable.
	staying := p.unavailable()
	for _, n := range pf.eligible {
		if n.inTransition {
			staying--
		}
	}
	rest, budget, named := pf.eligible, p.maxUnav-p.unavailable(), 0
	for len(rest) > 0 {
		limit := -1
		if canaryLeft > 0 {
			limit = canaryLeft
		}
		size := batchSize(rest, limit, budget)
		if size == 0 {
			break // failed nodes hold the whole budget: the rest waits for a person
		}
		pl.Nodes += int32(size)
		pl.BatchCount++
		if len(pl.Batches) < v1alpha1.MaxPlanBatches {
			b := v1alpha1.PlanBatch{Canary: canaryLeft > 0, Count: int32(size)}
			for _, n := range rest[:size] {
				if named == v1alpha1.MaxPlanNodeNames {
					break
				}
				b.Nodes = append(b.Nodes, n.name)
				named++
			}
			pl.Batches = append(pl.Batches, b)
		}
		canaryLeft = max(canaryLeft-size, 0)
		rest, budget = rest[size:], p.maxUnav-staying
	}
	for _, n := range pf.blocked {
		pl.Preflight.Problems = append(pl.Preflight.Problems, v1alpha1.PlanProblem{Name: n.name, Outcome: v1alpha1.PreflightBlocked, Reason: text.Cut(failed[n.name].reason, maxFailedReason)})
	}
	for _, n := range pf.waiting {
		pl.Preflight.Problems = append(pl.Preflight.Problems, v1alpha1.PlanProblem{Name: n.name, Outcome: v1alpha1.PreflightWaiting, Reason: "its agent has not reported kernel facts yet"})
	}
	if len(pl.Preflight.Problems) > v1alpha1.MaxPlanProblems {
		pl.Preflight.Problems = pl.Preflight.Problems[:v1alpha1.MaxPlanProblems]
	}
	return pl
}
