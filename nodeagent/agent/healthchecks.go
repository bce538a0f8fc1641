package agent

import (
	"net/netip"

	"github.com/proxyshift/proxyshift/nodeagent/healthcheck"
	"github.com/proxyshift/proxyshift/nodeagent/model"
	"github.com/proxyshift/proxyshift/nodeagent/report"
	"github.com/proxyshift/proxyshift/nodeagent/switcher"
)

// servingReporter passes the switcher's reports on after telling the
// health checks whether proxyshift now serves the node
// (healthcheck.Serving), so that kube-proxy's ports are released before
// a hand-back is reported and bound once a takeover is done. The checks
// it binds then are those of the model the dataplane holds; every later
// successful sync updates them (Fanout's after-sync hook).
type servingReporter struct {
	switcher.Reporter
	checks *healthcheck.Server
	// kubeProxyStopped is the ProxyNode's spec.kubeProxyStopped.
	kubeProxyStopped func() bool
	// programmed is the model last programmed into the dataplane
	// (Fanout.Model), nodeIPs the NodePort addresses it ran with.
	programmed func() *model.Snapshot
	nodeIPs    func() []netip.Addr
}

// SetSwitch updates who binds the health-check ports, then reports s.
func (r *servingReporter) SetSwitch(s report.Switch) {
	serving := healthcheck.Serving(s, r.kubeProxyStopped())
	if serving {
		r.checks.Update(healthcheck.Checks(r.programmed()), r.nodeIPs())
	}
	r.checks.SetServing(serving)
	r.Reporter.SetSwitch(s)
}
