package agent

import (
	"context"
	"fmt"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
	"github.com/proxyshift/proxyshift/nodeagent/cleanup"
	"github.com/proxyshift/proxyshift/nodeagent/dataplane"
)

// CleanupReport is what Cleanup did.
type CleanupReport struct {
	// Removed describes each removed object, one line each.
	Removed []string
	// Notes are the backends skipped (their tools or kernel parts are
	// missing: they cannot have programmed anything) and the removals
	// that failed, one line each, in order.
	Notes []string
	// Incomplete says a removal failed: run it again once fixed.
	Incomplete bool
}

// Cleanup removes everything proxyshift owns from the node (uninstall):
// first through each backend, which knows its objects exactly, then by
// name everywhere they can be.
func Cleanup(ctx context.Context, opts Options) CleanupReport {
	var rep CleanupReport
	for _, m := range []v1alpha1.ProxyMode{v1alpha1.ModeIPVS, v1alpha1.ModeIPTables, v1alpha1.ModeNFTables} {
		f, ok := opts.Backends[m]
		if !ok {
			continue
		}
		b, err := f(dataplane.NodeConfig{NodeName: opts.NodeName, MasqueradeBit: opts.MasqueradeBit}, v1alpha1.ProxySettings{})
		if err != nil {
			// The sweep below still looks by name.
			rep.Notes = append(rep.Notes, fmt.Sprintf("%s: skipped (%v)", m, err))
			continue
		}
		lines, err := b.Cleanup(ctx)
		rep.Removed = append(rep.Removed, lines...)
		if err != nil {
			rep.Incomplete = true
			rep.Notes = append(rep.Notes, fmt.Sprintf("%s: %v", m, err))
		}
	}
	lines, err := (&cleanup.Sweeper{NS: opts.NetNS}).Remove(ctx, cleanup.Proxyshift)
	rep.Removed = append(rep.Removed, lines...)
	if err != nil {
		rep.Incomplete = true
		rep.Notes = append(rep.Notes, err.Error())
	}
	return rep
}
