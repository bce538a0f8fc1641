package plan

import (
	"github.com/proxyshift/proxyshift/api/v1alpha1"
	"github.com/proxyshift/proxyshift/controllers/findings"
)

// behaviourDiff is what will behave differently on the nodes that still
// have to move (controllers/findings), from what serves them now.
func (p *pass) behaviourDiff() []v1alpha1.Finding {
	var moving []*v1alpha1.ProxyNode
	for _, n := range p.pending() {
		if n.pn != nil {
			moving = append(moving, n.pn)
		}
	}
	if len(moving) == 0 {
		return nil
	}
	return computeFindings(findings.Input{Target: p.cfg.Spec.Mode, Settings: &p.cfg.Spec.ProxySettings, Nodes: moving, Services: p.in.Services})
}

// computeFindings is findings.Compute; the tests of the acknowledgement
// hold add a Critical finding through it (no rule is Critical at present).
var computeFindings = findings.Compute

// unacknowledged are the Critical findings that hold a rollout's start.
func (p *pass) unacknowledged() []v1alpha1.Finding {
	return findings.Unacknowledged(p.findings, p.cfg.Spec.Rollout.AcknowledgedFindings)
}
