package plugin

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
)

// newPlanCommand is `kubectl proxyshift plan`.
func newPlanCommand(o *options) *cobra.Command {
	var request, start bool
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "plan PROXYCONFIG",
		Short: "Show the dry-run plan of a rollout: the nodes in batches, the canary first, and each node's preflight outcome.",
		Long: `Show the dry-run plan of a ProxyConfig (its status.plan): the nodes the rollout
would move, in the batches it moves them in, the canary first, and the nodes
preflight blocks or still waits for. The operator publishes the plan while
spec.rollout.dryRun is set, and changes no node meanwhile.

With --request the command sets spec.rollout.dryRun and waits for the
operator's plan. With --start it clears spec.rollout.dryRun: the rollout then
starts exactly the plan shown, unless nodes or the spec changed since.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if request && start {
				return fmt.Errorf("--request and --start exclude each other")
			}
			if start {
				return o.setRollout(cmd.Context(), args[0], "dryRun", false, "started: spec.rollout.dryRun cleared")
			}
			return o.plan(cmd.Context(), args[0], request, timeout)
		},
	}
	cmd.Flags().BoolVar(&request, "request", false, "Set spec.rollout.dryRun (no node is changed) and wait for the operator's plan.")
	cmd.Flags().BoolVar(&start, "start", false, "Clear spec.rollout.dryRun: start the planned rollout.")
	cmd.Flags().DurationVar(&timeout, "timeout", 30*time.Second, "How long --request waits for the plan.")
	return cmd
}

// plan prints the config's plan, after asking for one when request is set.
func (o *options) plan(ctx context.Context, name string, request bool, timeout time.Duration) error {
	c := &v1alpha1.ProxyConfig{}
	if request {
		c.Name = name
		if err := o.client.Patch(ctx, c, client.RawPatch(types.MergePatchType, []byte(`{"spec":{"rollout":{"dryRun":true}}}`))); err != nil {
			return err
		}
		// The plan is the operator's answer once its status describes
		// the spec the patch made.
		gen := c.Generation
		err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
			if err := o.client.Get(ctx, types.NamespacedName{Name: name}, c); err != nil {
				return false, err
			}
			return c.Status.ObservedGeneration >= gen && c.Status.Plan != nil, nil
		})
		if err != nil {
			return fmt.Errorf("spec.rollout.dryRun is set, but the operator published no plan within %s (is it running?): %w", timeout, err)
		}
	} else if err := o.client.Get(ctx, types.NamespacedName{Name: name}, c); err != nil {
		return err
	}
	if o.output != "" {
		return o.print([]runtime.Object{c})
	}
	return RenderPlan(o.streams.Out, c)
}

// RenderPlan writes a config's dry-run plan: a summary line, one line per
// batch, the preflight counts and the nodes that did not pass, and what
// the operator says of it.
func RenderPlan(w io.Writer, c *v1alpha1.ProxyConfig) error {
	pl := c.Status.Plan
	if pl == nil {
		why := "spec.rollout.dryRun is not set"
		if c.Spec.Rollout.DryRun {
			why = "the operator has not planned it yet"
		}
		_, err := fmt.Fprintf(w, "proxyconfig/%s has no plan: %s; `kubectl proxyshift plan %s --request` asks for one\n", c.Name, why, c.Name)
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintf(tw, "proxyconfig/%s would move %d nodes to %s in %d batches (maxUnavailable %d); no node was changed\n",
		c.Name, pl.Nodes, pl.Mode, pl.BatchCount, pl.MaxUnavailable)
	if len(pl.Batches) > 0 {
		fmt.Fprintf(tw, "BATCH\tCOUNT\tNODES\n")
	}
	for i, b := range pl.Batches {
		label := fmt.Sprint(i + 1)
		if b.Canary {
			label += " (canary)"
		}
		names := strings.Join(b.Nodes, ", ")
		if more := int(b.Count) - len(b.Nodes); more > 0 {
			names += fmt.Sprintf(" and %d more", more)
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\n", label, b.Count, names)
	}
	if more := int(pl.BatchCount) - len(pl.Batches); more > 0 {
		fmt.Fprintf(tw, "... %d more batches\n", more)
	}
	pf := pl.Preflight
	fmt.Fprintf(tw, "preflight: %d passed, %d blocked, %d waiting\n", pf.Passed, pf.Blocked, pf.Waiting)
	for _, p := range pf.Problems {
		fmt.Fprintf(tw, "  %s\t%s\t%s\n", p.Name, p.Outcome, firstLine(p.Reason))
	}
	for _, t := range []string{v1alpha1.ConditionProgressing, v1alpha1.ConditionDegraded} {
		if cond := meta.FindStatusCondition(c.Status.Conditions, t); cond != nil && cond.Message != "" && (t == v1alpha1.ConditionProgressing || cond.Status == "True") {
			fmt.Fprintf(tw, "%s: %s\n", cond.Reason, cond.Message)
		}
	}
	return tw.Flush()
}
