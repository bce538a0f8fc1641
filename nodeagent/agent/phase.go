package agent

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/proxyshift/proxyshift/nodeagent/report"
	"github.com/proxyshift/proxyshift/nodeagent/switcher"
)

// phaseReporter passes the switcher's reports on and publishes the phase
// as the gauge proxyshift_node_phase{phase, mode}: 1 for the phase the
// node is in (mode is the one serving), nothing else. It is how a
// standalone agent, which writes no ProxyNode, shows that a switch ended,
// and a dashboard sees a node stuck in one.
type phaseReporter struct {
	switcher.Reporter
	phase *prometheus.GaugeVec
}

func newPhaseReporter(next switcher.Reporter) *phaseReporter {
	return &phaseReporter{Reporter: next, phase: prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "proxyshift_node_phase",
		Help: "1 for the switch phase this node is in (Preparing, Programming, Verifying, CleaningUp, Active, Failed), labelled with the mode serving.",
	}, []string{"phase", "mode"})}
}

// SetSwitch records the phase, then reports it.
func (p *phaseReporter) SetSwitch(s report.Switch) {
	p.phase.Reset()
	p.phase.WithLabelValues(string(s.Phase), string(s.Active)).Set(1)
	p.Reporter.SetSwitch(s)
}
