package plan

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/proxyshift/proxyshift/api/contract"
	"github.com/proxyshift/proxyshift/api/v1alpha1"
)

// Selector returns a ProxyConfig's node selector; nil or empty selects
// every node.
func Selector(cfg *v1alpha1.ProxyConfig) (labels.Selector, error) {
	return cfg.Spec.NodeSelector.Selector()
}

// RolloutID names a rollout on the ProxyNodes it moves.
func RolloutID(config string, start time.Time) string {
	return config + "@" + start.UTC().Format(time.RFC3339)
}

// MaxUnavailable resolves spec.rollout.maxUnavailable against the number
// of selected nodes: a percentage rounds down, and the result is at least 1.
func MaxUnavailable(v *intstr.IntOrString, selected int) (int, error) {
	b, err := parseBudget(v)
	if err != nil {
		return 0, err
	}
	return b.of(selected), nil
}

// budget is spec.rollout.maxUnavailable, read: a number of nodes, or a
// percentage of the selected nodes.
type budget struct {
	n       int
	percent bool
}

// parseBudget reads maxUnavailable (nil: DefaultMaxUnavailable). It fails
// on a string that is not a percentage.
func parseBudget(v *intstr.IntOrString) (budget, error) {
	switch {
	case v == nil:
		return budget{n: DefaultMaxUnavailable}, nil
	case v.Type == intstr.Int:
		return budget{n: int(v.IntVal)}, nil
	}
	n, err := strconv.Atoi(strings.TrimSuffix(v.StrVal, "%"))
	if err != nil || !strings.HasSuffix(v.StrVal, "%") {
		return budget{}, fmt.Errorf("invalid value for IntOrString: %q is not a number or a percentage", v.StrVal)
	}
	return budget{n: n, percent: true}, nil
}

// of is the budget for selected nodes: a percentage rounds down, and the
// result is at least 1.
func (b budget) of(selected int) int {
	n := b.n
	if b.percent {
		n = n * selected / 100
	}
	return max(n, 1)
}

// policy is a ProxyConfig's spec, read and checked, defaults applied.
type policy struct {
	selector     labels.Selector
	timeout      time.Duration
	pause        time.Duration
	canary       int
	autoRollback bool
	paused       bool
	dryRun       bool
	maxUnav      budget
}

// parsePolicy reads the spec; the error names the field to fix.
func parsePolicy(cfg *v1alpha1.ProxyConfig) (policy, error) {
	var pol policy
	spec := &cfg.Spec
	if !contract.ValidTarget(spec.Mode) {
		return pol, fmt.Errorf("spec.mode %q is not one of iptables, nftables, ipvs, kube-proxy", spec.Mode)
	}
	sel, err := Selector(cfg)
	if err != nil {
		return pol, fmt.Errorf("spec.nodeSelector is invalid: %v", err)
	}
	pol.selector = sel
	r := &spec.Rollout
	if pol.timeout, err = r.NodeTimeout.Parse(DefaultNodeTimeout); err != nil || pol.timeout <= 0 {
		return pol, fmt.Errorf("spec.rollout.nodeTimeout %q is not a positive duration", r.NodeTimeout)
	}
	if pol.pause, err = r.Canary.Pause.Parse(0); err != nil || pol.pause < 0 {
		return pol, fmt.Errorf("spec.rollout.canary.pause %q is not a duration", r.Canary.Pause)
	}
	pol.canary = DefaultCanaryNodes
	if r.Canary.Nodes != nil {
		if *r.Canary.Nodes < 0 {
			return pol, fmt.Errorf("spec.rollout.canary.nodes %d is negative", *r.Canary.Nodes)
		}
		pol.canary = int(*r.Canary.Nodes)
	}
	if pol.maxUnav, err = parseBudget(r.MaxUnavailable); err != nil || pol.maxUnav.n < 0 || (!pol.maxUnav.percent && pol.maxUnav.n < 1) {
		return pol, fmt.Errorf("spec.rollout.maxUnavailable %q must be a number of at least 1 or a percentage", r.MaxUnavailable.String())
	}
	pol.autoRollback = r.AutoRollback == nil || *r.AutoRollback
	pol.paused = r.Paused
	pol.dryRun = r.DryRun
	return pol, nil
}
