package plugin

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
	"github.com/proxyshift/proxyshift/controllers/plan"
)

// newRollbackCommand is `kubectl proxyshift rollback`.
func newRollbackCommand(o *options) *cobra.Command {
	var planOnly bool
	cmd := &cobra.Command{
		Use:   "rollback PROXYCONFIG",
		Short: "Roll back a running or completed rollout: set spec.mode back to the mode its nodes ran before, moved by a normal rollout.",
		Long: `Roll back the current rollout of a ProxyConfig, running or completed.

The operator records on each ProxyNode it moves the mode the node ran before
(annotation network.proxyshift.io/previous-mode) and its settings. rollback
reads them from the nodes the current rollout moved, and sets spec.mode (and
the settings) of the ProxyConfig back to them, in one update that fails if
the ProxyConfig changed meanwhile. That is a new target for the operator: it
moves the nodes back with a normal rollout, preflight, canary first, then
batches within maxUnavailable, with the rollout policy of the spec. Nodes the
rollout had not moved yet keep running the previous mode.

With --plan-only spec.rollout.dryRun is set in the same update: the operator
plans the rollback without moving a node; see it with
` + "`kubectl proxyshift plan`" + `, start it with ` + "`kubectl proxyshift plan --start`" + `.

It refuses when the rollout moved no node, when the operator already rolled
its nodes back (autoRollback), or when they ran different modes before.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error { return o.rollback(cmd.Context(), args[0], planOnly) },
	}
	cmd.Flags().BoolVar(&planOnly, "plan-only", false, "Also set spec.rollout.dryRun: plan the rollback, move no node.")
	return cmd
}

// rollback sets the config's spec back to what its rollout's nodes ran.
func (o *options) rollback(ctx context.Context, name string, planOnly bool) error {
	c := &v1alpha1.ProxyConfig{}
	if err := o.client.Get(ctx, types.NamespacedName{Name: name}, c); err != nil {
		return err
	}
	if c.Spec.KubeProxy != nil {
		return o.rollbackKubeProxyMode(ctx, c, planOnly)
	}
	var pns v1alpha1.ProxyNodeList
	if err := o.client.List(ctx, &pns); err != nil {
		return err
	}
	spec, moved, err := RollbackSpec(c, pns.Items)
	if err != nil {
		return fmt.Errorf("cannot roll back proxyconfig/%s: %w", name, err)
	}
	from := c.Spec.Mode
	c.Spec = spec
	c.Spec.Rollout.DryRun = c.Spec.Rollout.DryRun || planOnly
	// An update, not a patch: it fails if the config changed since it
	// was read, so the rollback is of the rollout the user saw.
	if err := o.client.Update(ctx, c); err != nil {
		return err
	}
	if o.output != "" {
		return o.print([]runtime.Object{c})
	}
	next := "the operator moves the nodes back with the canary first, then in batches"
	if c.Spec.Rollout.DryRun {
		next = "spec.rollout.dryRun is set: see the plan with `kubectl proxyshift plan " + name + "`"
	}
	_, err = fmt.Fprintf(o.streams.Out, "proxyconfig/%s rolling back: spec.mode %s -> %s, the mode the %d nodes its rollout moved ran before; %s\n",
		name, from, spec.Mode, moved, next)
	return err
}

// rollbackKubeProxyMode sets spec.kubeProxy.mode back to the mode
// kube-proxy ran before the change (KubeProxyRollbackSpec).
func (o *options) rollbackKubeProxyMode(ctx context.Context, c *v1alpha1.ProxyConfig, planOnly bool) error {
	spec, err := KubeProxyRollbackSpec(c)
	if err != nil {
		return fmt.Errorf("cannot roll back proxyconfig/%s: %w", c.Name, err)
	}
	to := c.Spec.KubeProxy.Mode
	c.Spec = spec
	c.Spec.Rollout.DryRun = c.Spec.Rollout.DryRun || planOnly
	if err := o.client.Update(ctx, c); err != nil {
		return err
	}
	if o.output != "" {
		return o.print([]runtime.Object{c})
	}
	_, err = fmt.Fprintf(o.streams.Out, "proxyconfig/%s rolling back: spec.kubeProxy.mode %s -> %s, kube-proxy's mode before the change; "+
		"the operator takes the nodes still to move over, restores kube-proxy's ConfigMap and hands them back, canary first\n", c.Name, to, spec.KubeProxy.Mode)
	return err
}

// KubeProxyRollbackSpec is the spec that rolls back a change of
// kube-proxy's own mode: spec.kubeProxy.mode set back to the mode
// kube-proxy ran in before it (status.kubeProxyBridge.from).
func KubeProxyRollbackSpec(c *v1alpha1.ProxyConfig) (v1alpha1.ProxyConfigSpec, error) {
	spec := *c.Spec.DeepCopy()
	b := c.Status.KubeProxyBridge
	switch {
	case b == nil || b.ObservedGeneration != c.Generation:
		return spec, fmt.Errorf("the operator has not taken up this change of kube-proxy's mode yet (no status.kubeProxyBridge for generation %d)", c.Generation)
	case b.RollingBack:
		return spec, fmt.Errorf("the operator already rolls the change back to kube-proxy in %s mode (it failed: %s)", b.To, b.Failure)
	case spec.KubeProxy.Mode == b.From:
		return spec, fmt.Errorf("spec.kubeProxy.mode is %s already, the mode kube-proxy ran in before", b.From)
	}
	spec.KubeProxy.Mode = b.From
	return spec, nil
}

// RollbackSpec is the spec that rolls back the config's current rollout:
// spec.mode set to the mode the nodes that rollout moved ran before (their
// previous-mode annotation), with the settings they ran it with, and the
// rest of the spec kept. It returns how many nodes the rollout moved, or
// why there is nothing to roll back.
func RollbackSpec(c *v1alpha1.ProxyConfig, pns []v1alpha1.ProxyNode) (v1alpha1.ProxyConfigSpec, int, error) {
	spec := *c.Spec.DeepCopy()
	if c.Status.StartTime == nil {
		return spec, 0, fmt.Errorf("no rollout has started (phase %s)", orNone(string(c.Status.Phase)))
	}
	rid := plan.RolloutID(c.Name, c.Status.StartTime.Time)
	modes := map[string][]string{}
	settings := map[string]bool{}
	moved, returned := 0, 0
	for _, pn := range pns {
		a := pn.Annotations
		if a[plan.AnnotationRollout] != rid {
			continue
		}
		if a[plan.AnnotationRolledBack] == rid {
			returned++
			continue
		}
		moved++
		modes[a[plan.AnnotationPreviousMode]] = append(modes[a[plan.AnnotationPreviousMode]], pn.Name)
		if s := a[plan.AnnotationPreviousSettings]; s != "" {
			settings[s] = true
		}
	}
	switch {
	case moved == 0 && returned > 0:
		return spec, 0, fmt.Errorf("the operator already returned the %d nodes rollout %s moved to their previous mode", returned, rid)
	case moved == 0:
		return spec, 0, fmt.Errorf("rollout %s moved no node yet: nothing to roll back (pause it with `kubectl proxyshift pause`)", rid)
	case len(modes) > 1:
		var kinds []string
		for m, ns := range modes {
			kinds = append(kinds, fmt.Sprintf("%s on %s", orNone(m), strings.Join(ns, ", ")))
		}
		sort.Strings(kinds)
		return spec, 0, fmt.Errorf("the nodes rollout %s moved ran different modes before (%s): set spec.mode yourself, per node selector", rid, strings.Join(kinds, "; "))
	case len(settings) > 1:
		return spec, 0, fmt.Errorf("the nodes rollout %s moved ran their previous mode with different settings: set spec.mode and the settings yourself", rid)
	}
	var prev string
	for m := range modes {
		prev = m
	}
	if prev == "" {
		return spec, 0, fmt.Errorf("no previous mode is recorded on the nodes rollout %s moved (they ran no mode before)", rid)
	}
	spec.Mode = v1alpha1.ProxyMode(prev)
	if spec.Mode == c.Spec.Mode {
		return spec, 0, fmt.Errorf("spec.mode is %s already, the mode the nodes ran before", prev)
	}
	// The settings the nodes ran the mode with; without a record (the mode
	// ran before proxyshift asked for it), the spec's common settings.
	common := v1alpha1.ProxySettings{ClusterCIDRs: spec.ClusterCIDRs, NodePortAddresses: spec.NodePortAddresses}
	for s := range settings {
		common = v1alpha1.ProxySettings{}
		if err := json.Unmarshal([]byte(s), &common); err != nil {
			return spec, 0, fmt.Errorf("the recorded previous settings %q are unreadable: %v", s, err)
		}
	}
	if spec.Mode == v1alpha1.ModeKubeProxy {
		common = v1alpha1.ProxySettings{} // kube-proxy reads its own ConfigMap
	}
	spec.ProxySettings = common
	return spec, moved, nil
}
