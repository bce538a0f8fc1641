// Package dataplane defines the one interface every service-proxy backend
// (nftables, iptables, ipvs) implements, and the node settings they share.
// The sync loop, the switch protocol and the tests talk only to this
// interface, which is what lets one real-packet suite cover all backends.
package dataplane

import (
	"context"
	"errors"
	"net/netip"

	"github.com/proxyshift/proxyshift/nodeagent/model"
)

// NodeConfig is what a backend needs to know about its node, beyond the
// service model.
type NodeConfig struct {
	// NodeName is this node's name; endpoints on it are local.
	NodeName string
	// NodeIPs are the node's addresses NodePorts answer on, already
	// filtered by nodePortAddresses.
	NodeIPs []netip.Addr
	// PrimaryIPs are the node's primary address of each family, known
	// whatever nodePortAddresses says (kube-proxy's node IPs). A
	// loadBalancerSourceRange that holds the family's one also allows the
	// load-balancer IPs as sources (see Firewall.AllowIPs).
	PrimaryIPs []netip.Addr
	// ClusterCIDRs are the pod networks; traffic to a service from outside
	// them is masqueraded.
	ClusterCIDRs []netip.Prefix
	// MasqueradeAll masquerades all service traffic.
	MasqueradeAll bool
	// MasqueradeBit is the packet mark bit that flags masquerading.
	MasqueradeBit int
}

// SyncRequest is one sync: the whole model, and which service ports
// changed since the last successful sync.
type SyncRequest struct {
	Model *model.Snapshot
	// Changed lists the service ports to rewrite; ignored when Full.
	Changed model.ChangeSet
	// Full rewrites everything the backend owns from the model, repairing
	// any drift in the kernel.
	Full bool
	// Resync marks a periodic full sync (Full is set too), whose job is to
	// repair drift while changes keep flowing. A backend that has
	// programmed the model before may instead compare the kernel with
	// what it programmed and rewrite only when they differ; it should stop
	// reading as soon as ctx ends (a change is waiting) and return ctx's
	// error, having written nothing. A backend without that ability does
	// a full sync.
	Resync bool
}

// Preempted says whether err ends a Resync whose ctx was cancelled
// because a change is waiting: not a failure, the resync is just to be
// done again later.
func Preempted(ctx context.Context, req SyncRequest, err error) bool {
	return req.Resync && err != nil && ctx.Err() != nil && errors.Is(err, ctx.Err())
}

// Counts are the sizes of what a backend has programmed.
type Counts struct {
	// Services is the number of service ports programmed.
	Services int
	// Endpoints is the number of endpoints programmed.
	Endpoints int
	// Rules is the number of rules, map elements or virtual servers.
	Rules int
}

// Plus is c and o together.
func (c Counts) Plus(o Counts) Counts {
	return Counts{Services: c.Services + o.Services, Endpoints: c.Endpoints + o.Endpoints, Rules: c.Rules + o.Rules}
}

// Minus is c without o.
func (c Counts) Minus(o Counts) Counts {
	return Counts{Services: c.Services - o.Services, Endpoints: c.Endpoints - o.Endpoints, Rules: c.Rules - o.Rules}
}

// Backend is a service-proxy dataplane. Implementations own a fixed set of
// kernel objects, named after proxyshift, and touch nothing else.
type Backend interface {
	// Mode is the proxy mode the backend implements, as the API names
	// it (iptables, nftables, ipvs).
	Mode() string
	// Sync programs the model into the kernel in one atomic transaction
	// per IP family. On error the kernel keeps its previous state.
	Sync(ctx context.Context, req SyncRequest) (Counts, error)
	// Programmed reads back what the kernel holds for this backend. It
	// reads the kernel only, so it may run while a Sync does
	// (switcher.Fanout.Check reads back without holding syncs up, and
	// reads again when one came meanwhile).
	Programmed(ctx context.Context) (Counts, error)
	// Cleanup removes everything the backend owns and describes what it
	// removed, one line per object.
	Cleanup(ctx context.Context) ([]string, error)
}

// Warning is an error of a Sync that programmed everything but the
// objects it names: another program's, in the way of the model, which the
// backend left alone (or the service ports of an IP family the node does
// not carry, see FamilyMissingError). The sync is done all the same: callers do not retry
// it, and report the warning (Degraded, while the node serves).
type Warning interface {
	error
	// LeftAlone names the objects left alone.
	LeftAlone() []string
}

// SplitWarnings splits an error of Sync into its warnings and the rest,
// through errors.Join and %w wrapping: rest is nil when err holds
// warnings only (or is nil).
func SplitWarnings(err error) (warnings []Warning, rest error) {
	switch u := err.(type) {
	case nil:
		return nil, nil
	case Warning:
		return []Warning{u}, nil
	case interface{ Unwrap() []error }:
		var rests []error
		for _, e := range u.Unwrap() {
			ws, r := SplitWarnings(e)
			warnings = append(warnings, ws...)
			if r != nil {
				rests = append(rests, r)
			}
		}
		return warnings, errors.Join(rests...)
	case interface{ Unwrap() error }:
		ws, r := SplitWarnings(u.Unwrap())
		if r == nil {
			return ws, nil
		}
		return ws, err
	}
	return nil, err
}

// SettingsReporter is a Backend that sets kernel settings (sysctls) of
// its node, and reads them back for the node's status: ipvs, and iptables
// with localhost NodePorts (route_localnet). Backends that never set any
// (nftables) do not implement it.
type SettingsReporter interface {
	// KernelSettings returns the settings the backend sets, each with the
	// value the kernel holds ("" when it could not be read). On error the
	// settings it could list are still returned.
	KernelSettings() ([]KernelSetting, error)
}

// KernelSetting is one kernel setting (sysctl) a backend sets.
type KernelSetting struct {
	// Name is the sysctl's name, e.g. net.ipv4.vs.conntrack.
	Name string
	// Want is the value the backend sets.
	Want string
	// Value is the value the kernel holds; empty when it could not be
	// read (the setting does not exist yet, e.g. before ip_vs is loaded).
	Value string
}

// KernelSettings returns the kernel settings b sets, read back: none for
// a backend that is no SettingsReporter (or nil).
func KernelSettings(b Backend) ([]KernelSetting, error) {
	r, ok := b.(SettingsReporter)
	if !ok {
		return nil, nil
	}
	return r.KernelSettings()
}
