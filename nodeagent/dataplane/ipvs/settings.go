package ipvs

import (
	"fmt"
	"net/netip"
	"slices"
	"time"

	libipvs "github.com/moby/ipvs"
)

// Timeouts are IPVS's connection timeouts, one set per network
// namespace. Zero leaves the kernel's value (as IPVS itself does).
type Timeouts struct {
	// TCP is the idle timeout of established TCP connections.
	TCP time.Duration
	// TCPFin is the timeout of TCP connections after a FIN.
	TCPFin time.Duration
	// UDP is the idle timeout of UDP flows.
	UDP time.Duration
}

// WithTimeouts makes every full sync set IPVS's connection timeouts in
// the backend's namespace (zero fields leave the kernel's values).
func WithTimeouts(t Timeouts) Option {
	return func(b *Backend) { b.timeouts = t }
}

// WithExcludeCIDRs protects the virtual services whose address lies in
// one of cidrs: the backend never deletes them, not when their service
// port goes, nor on a full sync or Cleanup (kube-proxy's
// --ipvs-exclude-cidrs). It still creates and updates those the model
// wants; one it stops wanting is left in the kernel as it is, and
// forgotten.
func WithExcludeCIDRs(cidrs ...netip.Prefix) Option {
	return func(b *Backend) { b.exclude = cidrs }
}

// excluded says whether addr lies in one of cidrs.
func excluded(cidrs []netip.Prefix, addr netip.Addr) bool {
	return slices.ContainsFunc(cidrs, func(p netip.Prefix) bool { return p.Contains(addr) })
}

// deletable returns the virtual services of keys whose address lies in
// none of the excluded cidrs, in their order.
func deletable(cidrs []netip.Prefix, keys []vsKey) []vsKey {
	return slices.DeleteFunc(keys, func(k vsKey) bool { return excluded(cidrs, k.addr) })
}

// timeoutsToSet returns what SetConfig must be given to bring the kernel's
// timeouts from have to want, or nil when they match already. A zero
// field of want, as of the result, leaves the kernel's value.
func timeoutsToSet(have *libipvs.Config, want Timeouts) *libipvs.Config {
	set := &libipvs.Config{TimeoutTCP: want.TCP, TimeoutTCPFin: want.TCPFin, TimeoutUDP: want.UDP}
	same := func(w, h time.Duration) bool { return w == 0 || w == h }
	if same(want.TCP, have.TimeoutTCP) && same(want.TCPFin, have.TimeoutTCPFin) && same(want.UDP, have.TimeoutUDP) {
		return nil
	}
	return set
}

// setTimeouts sets the backend's timeouts in its namespace, if it has any
// the kernel does not hold yet.
func (b *Backend) setTimeouts(kn *kernel) error {
	if b.timeouts == (Timeouts{}) {
		return nil
	}
	have, err := kn.ipvs.GetConfig()
	if err != nil {
		return fmt.Errorf("ipvs: read timeouts: %w", err)
	}
	if set := timeoutsToSet(have, b.timeouts); set != nil {
		if err := kn.ipvs.SetConfig(set); err != nil {
			return fmt.Errorf("ipvs: set timeouts: %w", err)
		}
	}
	return nil
}
