package dataplane

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/proxyshift/proxyshift/internal/text"
	"github.com/proxyshift/proxyshift/nodeagent/model"
	"github.com/proxyshift/proxyshift/nodeagent/nsexec"
)

// SumFamilies adds up what count says of each family, in order. It stops
// at the first error, or when ctx ends, returning what it added so far.
func SumFamilies[F any](ctx context.Context, families []F, count func(F) (Counts, error)) (Counts, error) {
	var total Counts
	for _, f := range families {
		if err := ctx.Err(); err != nil {
			return total, err
		}
		c, err := count(f)
		total = total.Plus(c)
		if err != nil {
			return total, err
		}
	}
	return total, nil
}

// SyncFamilies calls sync, in the order of families, for each family whose
// IP family (given by key) the model holds; families the model lacks are
// left as they are. It stops early when ctx ends, and returns every
// family's error joined, so one family failing does not keep the other
// from being synced. A request without a model is an error.
func SyncFamilies[F any](ctx context.Context, req SyncRequest, families []F, key func(F) corev1.IPFamily,
	sync func(F, map[model.ServicePortName]*model.ServicePort) error) error {
	if req.Model == nil {
		return errors.New("dataplane: sync without a model")
	}
	var errs []error
	for _, f := range families {
		ports, ok := req.Model.Ports[key(f)]
		if !ok {
			continue
		}
		if err := ctx.Err(); err != nil {
			errs = append(errs, err)
			break
		}
		if err := sync(f, ports); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// FamilyMissingError is a Warning: the model holds service ports of an IP
// family the node does not carry (IPv6 turned off by sysctl, or a kernel
// without IPv6). The backend programmed the other family and nothing of
// this one: there is nothing to deliver its packets to. The sync is done
// all the same, and the node reports the family it lacks.
type FamilyMissingError struct {
	// Family is the IP family the node lacks.
	Family corev1.IPFamily
	// Reason says why the node lacks it, naming the setting to change.
	Reason string
	// Ports are the service ports of the family, not programmed, sorted.
	Ports []string
}

var _ Warning = (*FamilyMissingError)(nil)

// Error names the family, why the node lacks it and the ports skipped.
func (e *FamilyMissingError) Error() string {
	return fmt.Sprintf("the node has no %s (%s): %d %s service ports not programmed: %s",
		e.Family, e.Reason, len(e.Ports), e.Family, text.List(e.Ports, ", ", 10))
}

// LeftAlone returns the service ports not programmed.
func (e *FamilyMissingError) LeftAlone() []string { return e.Ports }

// MissingFamily says why the node whose network namespace is ns cannot
// carry IP family f, or "" when it can. Only IPv6 can be missing: it is
// when the kernel has none (no net/ipv6 under procSys, "" for /proc/sys)
// or net.ipv6.conf.all.disable_ipv6 is 1 there. The sysctls are read in
// ns, whose they are.
func MissingFamily(ns nsexec.NS, procSys string, f corev1.IPFamily) (string, error) {
	if f != corev1.IPv6Protocol {
		return "", nil
	}
	if procSys == "" {
		procSys = "/proc/sys"
	}
	var reason string
	err := ns.Do(func() error {
		v, err := os.ReadFile(filepath.Join(procSys, "net/ipv6/conf/all/disable_ipv6"))
		switch {
		case errors.Is(err, os.ErrNotExist):
			reason = "the kernel has no IPv6: booted with ipv6.disable=1 or built without it"
		case err != nil:
			return fmt.Errorf("dataplane: read net.ipv6.conf.all.disable_ipv6: %w", err)
		case strings.TrimSpace(string(v)) == "1":
			reason = "IPv6 is turned off: net.ipv6.conf.all.disable_ipv6 = 1"
		}
		return nil
	})
	return reason, err
}

// WithoutMissingFamilies returns req without the families the node in ns
// lacks (MissingFamily; procSys as there), for a backend to sync what is
// left, and a *FamilyMissingError for each of them that has service
// ports, joined. A family whose check fails is kept, and the failure
// returned with the warnings. The model itself is not changed.
func WithoutMissingFamilies(ns nsexec.NS, procSys string, req SyncRequest) (SyncRequest, error) {
	if req.Model == nil {
		return req, nil
	}
	var errs []error
	kept := maps.Clone(req.Model.Ports)
	for _, f := range slices.Sorted(maps.Keys(req.Model.Ports)) {
		reason, err := MissingFamily(ns, procSys, f)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if reason == "" {
			continue
		}
		delete(kept, f)
		if ports := req.Model.Ports[f]; len(ports) > 0 {
			e := &FamilyMissingError{Family: f, Reason: reason}
			for name := range ports {
				e.Ports = append(e.Ports, name.String())
			}
			slices.Sort(e.Ports)
			errs = append(errs, e)
		}
	}
	if len(kept) != len(req.Model.Ports) {
		snap := *req.Model
		snap.Ports = kept
		req.Model = &snap
	}
	return req, errors.Join(errs...)
}
