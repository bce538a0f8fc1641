package model

import (
	"maps"
	"reflect"
	"slices"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Tracker keeps the model of one node up to date from informer events and
// records which service ports changed. It is safe for concurrent use.
//
// The event methods take the API objects themselves: on deletes the caller
// unwraps cache.DeletedFinalStateUnknown first. Nil objects are ignored.
// The Tracker keeps the objects it is given and never modifies them, so
// they must not be modified afterwards either (informer cache objects
// never are).
type Tracker struct {
	nodeName string
	onError  func(error)
	changed  chan struct{}

	mu       sync.Mutex
	services map[ServiceName]*corev1.Service
	// slices holds each service's EndpointSlices by slice name, also for
	// services not seen yet; owner maps a slice back to its service.
	slices map[ServiceName]map[string]*discoveryv1.EndpointSlice
	owner  map[types.NamespacedName]ServiceName
	// built is each service's last build, and errText the text of the
	// errors last reported for it.
	built   map[ServiceName][]*ServicePort
	errText map[ServiceName]string
	// ports is the model; shared says a Snapshot holds it, so it is
	// copied before the next write.
	ports   map[corev1.IPFamily]map[ServicePortName]*ServicePort
	shared  bool
	changes ChangeSet
}

// NewTracker returns an empty Tracker for the node nodeName. onError, if
// not nil, receives every FieldError of a service's build, each once for
// as long as the service's set of errors stays the same; it is called
// without the Tracker's lock held.
func NewTracker(nodeName string, onError func(error)) *Tracker {
	return &Tracker{
		nodeName: nodeName,
		onError:  onError,
		changed:  make(chan struct{}, 1),
		services: map[ServiceName]*corev1.Service{},
		slices:   map[ServiceName]map[string]*discoveryv1.EndpointSlice{},
		owner:    map[types.NamespacedName]ServiceName{},
		built:    map[ServiceName][]*ServicePort{},
		errText:  map[ServiceName]string{},
		ports: map[corev1.IPFamily]map[ServicePortName]*ServicePort{
			corev1.IPv4Protocol: {},
			corev1.IPv6Protocol: {},
		},
		changes: ChangeSet{},
	}
}

// Changed receives a value when the model has changes not yet taken by
// Snapshot. Signals coalesce: one receive may stand for many events.
func (t *Tracker) Changed() <-chan struct{} { return t.changed }

// Snapshot returns the whole model and the names of the service ports
// changed since the previous call, and starts a new change set. A port
// that changed and changed back in between is named too. The returned
// model never changes afterwards and must not be modified.
func (t *Tracker) Snapshot() (*Snapshot, ChangeSet) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.shared = true
	changes := t.changes
	t.changes = ChangeSet{}
	select { // the changes the pending signal stood for are taken now
	case <-t.changed:
	default:
	}
	return &Snapshot{Ports: t.ports}, changes
}

// OnServiceAdd records a new Service.
func (t *Tracker) OnServiceAdd(svc *corev1.Service) { t.OnServiceUpdate(svc) }

// OnServiceUpdate records the new state of a Service.
func (t *Tracker) OnServiceUpdate(svc *corev1.Service) {
	if svc == nil {
		return
	}
	t.update(func() []ServiceName {
		key := ServiceName{Namespace: svc.Namespace, Name: svc.Name}
		t.services[key] = svc
		return []ServiceName{key}
	})
}

// OnServiceDelete records the deletion of a Service.
func (t *Tracker) OnServiceDelete(svc *corev1.Service) {
	if svc == nil {
		return
	}
	t.update(func() []ServiceName {
		key := ServiceName{Namespace: svc.Namespace, Name: svc.Name}
		delete(t.services, key)
		return []ServiceName{key}
	})
}

// OnEndpointSliceAdd records a new EndpointSlice.
func (t *Tracker) OnEndpointSliceAdd(s *discoveryv1.EndpointSlice) { t.OnEndpointSliceUpdate(s) }

// OnEndpointSliceUpdate records the new state of an EndpointSlice. A slice
// without the kubernetes.io/service-name label belongs to no service and
// is ignored.
func (t *Tracker) OnEndpointSliceUpdate(s *discoveryv1.EndpointSlice) {
	if s == nil {
		return
	}
	t.update(func() []ServiceName {
		affected := t.removeSlice(s)
		name := s.Labels[discoveryv1.LabelServiceName]
		if name == "" {
			return affected
		}
		key := ServiceName{Namespace: s.Namespace, Name: name}
		if t.slices[key] == nil {
			t.slices[key] = map[string]*discoveryv1.EndpointSlice{}
		}
		t.slices[key][s.Name] = s
		t.owner[types.NamespacedName{Namespace: s.Namespace, Name: s.Name}] = key
		return append(affected, key)
	})
}

// OnEndpointSliceDelete records the deletion of an EndpointSlice.
func (t *Tracker) OnEndpointSliceDelete(s *discoveryv1.EndpointSlice) {
	if s == nil {
		return
	}
	t.update(func() []ServiceName { return t.removeSlice(s) })
}

// removeSlice forgets slice s and returns the service it belonged to.
func (t *Tracker) removeSlice(s *discoveryv1.EndpointSlice) []ServiceName {
	id := types.NamespacedName{Namespace: s.Namespace, Name: s.Name}
	key, ok := t.owner[id]
	if !ok {
		return nil
	}
	delete(t.owner, id)
	delete(t.slices[key], s.Name)
	if len(t.slices[key]) == 0 {
		delete(t.slices, key)
	}
	return []ServiceName{key}
}

// update applies one event under the lock, rebuilds the services it
// affected, then signals changes and reports errors.
func (t *Tracker) update(apply func() []ServiceName) {
	t.mu.Lock()
	var errs []error
	for _, key := range apply() {
		errs = append(errs, t.rebuild(key)...)
	}
	pending := len(t.changes) > 0
	t.mu.Unlock()

	if pending {
		select {
		case t.changed <- struct{}{}:
		default:
		}
	}
	if t.onError != nil {
		for _, err := range errs {
			t.onError(err)
		}
	}
}

// familyPort keys a service's ports across families.
type familyPort struct {
	family corev1.IPFamily
	name   ServicePortName
}

// rebuild builds service key again, updates the model and the change set
// where the result differs, and returns the build errors if they differ
// from the ones last reported.
func (t *Tracker) rebuild(key ServiceName) []error {
	var ports []*ServicePort
	var errs []error
	if svc := t.services[key]; svc != nil {
		ports, errs = BuildServicePorts(svc, slices.Collect(maps.Values(t.slices[key])), t.nodeName)
	}

	old := map[familyPort]*ServicePort{}
	for _, sp := range t.built[key] {
		old[familyPort{sp.Family, sp.Name}] = sp
	}
	for _, sp := range ports {
		k := familyPort{sp.Family, sp.Name}
		if prev, ok := old[k]; !ok || !reflect.DeepEqual(*prev, *sp) {
			t.writable(sp.Family)[sp.Name] = sp
			t.changes[sp.Name] = struct{}{}
		}
		delete(old, k)
	}
	for k := range old {
		delete(t.writable(k.family), k.name)
		t.changes[k.name] = struct{}{}
	}
	if len(ports) == 0 {
		delete(t.built, key)
	} else {
		t.built[key] = ports
	}

	var text []string
	for _, err := range errs {
		text = append(text, err.Error())
	}
	joined := strings.Join(text, "\n")
	if joined == t.errText[key] {
		return nil
	}
	if joined == "" {
		delete(t.errText, key)
	} else {
		t.errText[key] = joined
	}
	return errs
}

// writable returns the model's map of one family, first copying the model
// if a Snapshot holds it.
func (t *Tracker) writable(fam corev1.IPFamily) map[ServicePortName]*ServicePort {
	if t.shared {
		ports := make(map[corev1.IPFamily]map[ServicePortName]*ServicePort, len(t.ports))
		for f, m := range t.ports {
			ports[f] = maps.Clone(m)
		}
		t.ports, t.shared = ports, false
	}
	return t.ports[fam]
}
