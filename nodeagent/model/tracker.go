package model

import (
	"maps"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Tracker keeps the model of one node up to date from informer events and
// records which service ports changed. It is safe for concurrent use.
//
// The event methods take the API objects themselves (an EndpointSlice as
// the Slice the informers keep of it): on deletes the caller unwraps
// cache.DeletedFinalStateUnknown first. Nil objects are ignored.
// The Tracker keeps the objects it is given and never modifies them, so
// they must not be modified afterwards either (informer cache objects
// never are).
type Tracker struct {
	// node is the node the model is for; its Zone changes under mu.
	node    Node
	onError func(error)
	changed chan struct{}
	// start is when the Tracker was made: changes triggered before it
	// (the slices of the initial list) are not measured.
	start    time.Time
	observer Observer

	mu       sync.Mutex
	services map[ServiceName]*corev1.Service
	// slices holds each service's EndpointSlices (one name once each),
	// also for services not seen yet; owner maps a slice back to its
	// service. A list, not a map by name: most services have one slice,
	// and a map for each took 3 MB at 10 000 services.
	slices map[ServiceName][]*Slice
	owner  map[types.NamespacedName]ServiceName
	// built is each service's last build and buildErrs its errors;
	// published is what of it the model holds (the build without the
	// external addresses the claims refused), refused how many refusals
	// that took, and errText the text of the errors last reported for it.
	built     map[ServiceName][]*ServicePort
	buildErrs map[ServiceName][]error
	published map[ServiceName][]*ServicePort
	refused   map[ServiceName]int
	errText   map[ServiceName]string
	claims    *claims
	// ports is the model; shared says a Snapshot holds it, so it is
	// copied before the next write. The copy is made ahead, once the sync
	// of that Snapshot has ended (Synced), by a goroutine of its own that
	// hands it over on spare: copying 10 000 ports takes about 1.5 ms,
	// which the next event would otherwise spend before its change could
	// be synced, and allocates about 1 MB, most of what a node allocates
	// between two changes: made as the Snapshot was taken, it was what
	// started the garbage collector in the middle of the sync of a change
	// (at 10 000 services a collection's 30 ms beside the sync doubled or
	// tripled its time). copying says that copy is under way or waiting
	// on spare; a write before it copies the model itself.
	ports   map[corev1.IPFamily]map[ServicePortName]*ServicePort
	shared  bool
	copying bool
	spare   chan map[corev1.IPFamily]map[ServicePortName]*ServicePort
	changes ChangeSet
	// triggers are the trigger times of the slice changes not yet taken
	// by Snapshot, by slice.
	triggers map[types.NamespacedName][]Trigger
	// deferred, after DeferUntilSnapshot, holds the services events
	// changed since, which the next Snapshot builds once each; nil when
	// every event builds what it changed.
	deferred map[ServiceName]struct{}
}

// Observer hears of the events a Tracker receives, for metrics. Its
// methods are called without the Tracker's lock held and must not block.
type Observer interface {
	// ServiceChange is called for every Service event.
	ServiceChange()
	// EndpointSliceChange is called for every event of an EndpointSlice
	// of IPv4 or IPv6 addresses that belongs to a service.
	EndpointSliceChange()
	// Queued is called for every event that leaves changes to sync.
	Queued()
}

// NewTracker returns an empty Tracker for the node nodeName. onError, if
// not nil, receives every FieldError of a service's build and every
// Refusal of its external addresses (see claims.go), each once for as long
// as the service's set of errors stays the same; it is called without the
// Tracker's lock held.
func NewTracker(nodeName string, onError func(error)) *Tracker {
	return &Tracker{
		node:      Node{Name: nodeName},
		onError:   onError,
		changed:   make(chan struct{}, 1),
		spare:     make(chan map[corev1.IPFamily]map[ServicePortName]*ServicePort, 1),
		start:     time.Now(),
		services:  map[ServiceName]*corev1.Service{},
		slices:    map[ServiceName][]*Slice{},
		owner:     map[types.NamespacedName]ServiceName{},
		built:     map[ServiceName][]*ServicePort{},
		buildErrs: map[ServiceName][]error{},
		published: map[ServiceName][]*ServicePort{},
		refused:   map[ServiceName]int{},
		errText:   map[ServiceName]string{},
		claims:    newClaims(nodeName),
		ports: map[corev1.IPFamily]map[ServicePortName]*ServicePort{
			corev1.IPv4Protocol: {},
			corev1.IPv6Protocol: {},
		},
		changes:  ChangeSet{},
		triggers: map[types.NamespacedName][]Trigger{},
	}
}

// DeferUntilSnapshot makes the events until the next Snapshot only note
// the services they change, and that Snapshot build each of them once
// (and report their errors). The informers' first lists deliver a Service
// and its EndpointSlices as events of their own: building at each event
// builds most services twice, once without endpoints, before the first
// sync can start (BenchmarkInitialLists10k).
func (t *Tracker) DeferUntilSnapshot() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.deferred == nil {
		t.deferred = map[ServiceName]struct{}{}
	}
}

// Observe makes o hear of the events the Tracker receives from now on; call
// it before the first event.
func (t *Tracker) Observe(o Observer) { t.observer = o }

// Changed receives a value when the model has changes not yet taken by
// Snapshot. Signals coalesce: one receive may stand for many events.
func (t *Tracker) Changed() <-chan struct{} { return t.changed }

// Snapshot returns the whole model and the names of the service ports
// changed since the previous call, and starts a new change set. A port
// that changed and changed back in between is named too. The returned
// model never changes afterwards and must not be modified. After
// DeferUntilSnapshot it first builds the services deferred.
func (t *Tracker) Snapshot() (*Snapshot, ChangeSet) {
	snap, changes, errs := t.snapshot()
	t.report(errs)
	return snap, changes
}

func (t *Tracker) snapshot() (*Snapshot, ChangeSet, []error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	var errs []error
	if t.deferred != nil {
		for key := range t.deferred {
			errs = append(errs, t.rebuild(key)...)
		}
		t.deferred = nil
	}
	t.shared = true
	changes := t.changes
	t.changes = ChangeSet{}
	var triggers []Trigger
	for _, ts := range t.triggers {
		triggers = append(triggers, ts...)
	}
	clear(t.triggers)
	select { // the changes the pending signal stood for are taken now
	case <-t.changed:
	default:
	}
	return &Snapshot{Ports: t.ports, Triggers: triggers}, changes, errs
}

// OnServiceAdd records a new Service.
func (t *Tracker) OnServiceAdd(svc *corev1.Service) { t.OnServiceUpdate(svc) }

// OnServiceUpdate records the new state of a Service.
func (t *Tracker) OnServiceUpdate(svc *corev1.Service) {
	if svc == nil {
		return
	}
	t.observe(Observer.ServiceChange)
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
	t.observe(Observer.ServiceChange)
	t.update(func() []ServiceName {
		key := ServiceName{Namespace: svc.Namespace, Name: svc.Name}
		delete(t.services, key)
		return []ServiceName{key}
	})
}

// OnEndpointSliceAdd records a new EndpointSlice.
func (t *Tracker) OnEndpointSliceAdd(s *Slice) { t.OnEndpointSliceUpdate(s) }

// OnEndpointSliceUpdate records the new state of an EndpointSlice. A slice
// without the kubernetes.io/service-name label belongs to no service and
// is ignored. The slice's last-change-trigger-time, if it has one and it
// is later than the Tracker's start, goes to the next Snapshot.
func (t *Tracker) OnEndpointSliceUpdate(s *Slice) {
	if s == nil {
		return
	}
	t.observeSlice(s)
	t.update(func() []ServiceName {
		affected := t.removeSlice(s)
		name := s.Labels[discoveryv1.LabelServiceName]
		if name == "" {
			return affected
		}
		if tr, ok := t.trigger(s); ok {
			id := types.NamespacedName{Namespace: s.Namespace, Name: s.Name}
			t.triggers[id] = append(t.triggers[id], tr)
		}
		key := ServiceName{Namespace: s.Namespace, Name: name}
		t.slices[key] = append(t.slices[key], s)
		t.owner[types.NamespacedName{Namespace: s.Namespace, Name: s.Name}] = key
		return append(affected, key)
	})
}

// OnEndpointSliceDelete records the deletion of an EndpointSlice.
func (t *Tracker) OnEndpointSliceDelete(s *Slice) {
	if s == nil {
		return
	}
	t.observeSlice(s)
	t.update(func() []ServiceName {
		// Like kube-proxy, a deletion is not measured: the slice's trigger
		// time is that of its last update, not of its deletion.
		delete(t.triggers, types.NamespacedName{Namespace: s.Namespace, Name: s.Name})
		return t.removeSlice(s)
	})
}

// trigger returns the trigger time of slice s, if it has one to measure.
// Like kube-proxy, it takes slices of IPv4 and IPv6 addresses only, and
// only changes triggered after the Tracker started.
func (t *Tracker) trigger(s *Slice) (Trigger, bool) {
	fam, ok := sliceFamily(s)
	v, has := s.Annotations[corev1.EndpointsLastChangeTriggerTime]
	if !ok || !has {
		return Trigger{}, false
	}
	at, err := time.Parse(time.RFC3339Nano, v)
	if err != nil || !at.After(t.start) {
		return Trigger{}, false
	}
	return Trigger{Family: fam, Time: at}, true
}

// sliceFamily is the IP family of slice s's addresses.
func sliceFamily(s *Slice) (corev1.IPFamily, bool) {
	switch s.AddressType {
	case discoveryv1.AddressTypeIPv4:
		return corev1.IPv4Protocol, true
	case discoveryv1.AddressTypeIPv6:
		return corev1.IPv6Protocol, true
	}
	return "", false
}

// observeSlice tells the observer of an event of slice s, if it is one
// that kube-proxy counts: a slice of IP addresses of a service.
func (t *Tracker) observeSlice(s *Slice) {
	if _, ok := sliceFamily(s); ok && s.Labels[discoveryv1.LabelServiceName] != "" {
		t.observe(Observer.EndpointSliceChange)
	}
}

// observe calls method f of the observer, if there is one.
func (t *Tracker) observe(f func(Observer)) {
	if t.observer != nil {
		f(t.observer)
	}
}

// removeSlice forgets slice s and returns the service it belonged to.
func (t *Tracker) removeSlice(s *Slice) []ServiceName {
	id := types.NamespacedName{Namespace: s.Namespace, Name: s.Name}
	key, ok := t.owner[id]
	if !ok {
		return nil
	}
	delete(t.owner, id)
	rest := slices.DeleteFunc(t.slices[key], func(o *Slice) bool { return o.Name == s.Name })
	if len(rest) == 0 {
		delete(t.slices, key)
	} else {
		t.slices[key] = rest
	}
	return []ServiceName{key}
}

// update applies one event under the lock, rebuilds the services it
// affected, then signals changes and reports errors.
func (t *Tracker) update(apply func() []ServiceName) {
	t.mu.Lock()
	var errs []error
	for _, key := range apply() {
		if t.deferred != nil {
			t.deferred[key] = struct{}{}
			continue
		}
		errs = append(errs, t.rebuild(key)...)
	}
	pending := len(t.changes) > 0 || len(t.deferred) > 0
	t.mu.Unlock()

	if pending {
		t.observe(Observer.Queued)
		select {
		case t.changed <- struct{}{}:
		default:
		}
	}
	t.report(errs)
}

// report hands errs to onError; call it without the lock held.
func (t *Tracker) report(errs []error) {
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

// SetNodeAddrs sets the node's own addresses, which no Service may take
// as an external address (see claims.go).
func (t *Tracker) SetNodeAddrs(addrs []netip.Addr) {
	t.update(func() []ServiceName { return t.claims.setNode(addrs) })
}

// SetNodeZone sets the node's zone, the value of its
// topology.kubernetes.io/zone label ("" without one), which decides the
// endpoints that zone hints send this node's traffic to (see select.go).
// A change rebuilds every service; only the ports whose endpoints have
// zone hints change in the model.
func (t *Tracker) SetNodeZone(zone string) {
	t.update(func() []ServiceName {
		if zone == t.node.Zone {
			return nil
		}
		t.node.Zone = zone
		return slices.Collect(maps.Keys(t.services))
	})
}

// Refused is how many external addresses of Services the model leaves out
// now, because another Service or the node owns them.
func (t *Tracker) Refused() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for _, c := range t.refused {
		n += c
	}
	return n
}

// rebuild builds service key again, updates the claims and publishes the
// services whose claims that may have changed. It returns the errors of
// each published service whose errors differ from the ones last reported.
func (t *Tracker) rebuild(key ServiceName) []error {
	var ports []*ServicePort
	var errs []error
	if svc := t.services[key]; svc != nil {
		ports, errs = BuildServicePorts(svc, t.slices[key], t.node)
	}
	oldKeys := claimKeys(t.built[key])
	setOrDelete(t.built, key, ports, len(ports) > 0)
	setOrDelete(t.buildErrs, key, errs, len(errs) > 0)
	var out []error
	for _, s := range t.claims.index(key, oldKeys, claimKeys(ports)) {
		out = append(out, t.publish(s)...)
	}
	return out
}

// publish puts service key's build, less what its claims refuse, into the
// model, recording the ports whose model changed, and returns its errors
// if they differ from the ones last reported.
func (t *Tracker) publish(key ServiceName) []error {
	ports, refusals := t.claims.resolve(key, t.built[key], t)
	old := map[familyPort]*ServicePort{}
	for _, sp := range t.published[key] {
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
	setOrDelete(t.published, key, ports, len(ports) > 0)
	setOrDelete(t.refused, key, len(refusals), len(refusals) > 0)

	errs := slices.Clone(t.buildErrs[key])
	var text []string
	for _, err := range errs {
		text = append(text, err.Error())
	}
	for _, r := range refusals {
		errs = append(errs, r)
		text = append(text, r.Error())
	}
	joined := strings.Join(text, "\n")
	if joined == t.errText[key] {
		return nil
	}
	setOrDelete(t.errText, key, joined, joined != "")
	return errs
}

// builtPorts and created give the claims what they need to know of a
// service (the Tracker is their claimSource).
func (t *Tracker) builtPorts(key ServiceName) []*ServicePort { return t.built[key] }

func (t *Tracker) created(key ServiceName) time.Time {
	if svc := t.services[key]; svc != nil {
		return svc.CreationTimestamp.Time
	}
	return time.Time{}
}

// setOrDelete stores v under k if keep, else deletes k, so that the
// Tracker's maps hold no empty entries.
func setOrDelete[K comparable, V any](m map[K]V, k K, v V, keep bool) {
	if !keep {
		delete(m, k)
		return
	}
	m[k] = v
}

// writable returns the model's map of one family, first replacing the
// model by its copy if a Snapshot holds it (the one Synced started,
// waiting for it if it is still being made, or else one made here).
func (t *Tracker) writable(fam corev1.IPFamily) map[ServicePortName]*ServicePort {
	if t.shared {
		if t.copying {
			t.ports = <-t.spare
		} else {
			t.ports = copyPorts(t.ports)
		}
		t.shared, t.copying = false, false
	}
	return t.ports[fam]
}

// Synced tells the tracker that the sync of its last Snapshot has ended,
// so that it makes the copy of the model the next write needs now, while
// nothing waits for it (see Tracker.ports).
func (t *Tracker) Synced() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.shared && !t.copying {
		t.copying = true
		go func(ports map[corev1.IPFamily]map[ServicePortName]*ServicePort) {
			// Nothing writes to ports any more: it is read unlocked.
			t.spare <- copyPorts(ports)
		}(t.ports)
	}
}

func copyPorts(ports map[corev1.IPFamily]map[ServicePortName]*ServicePort) map[corev1.IPFamily]map[ServicePortName]*ServicePort {
	out := make(map[corev1.IPFamily]map[ServicePortName]*ServicePort, len(ports))
	for f, m := range ports {
		out[f] = maps.Clone(m)
	}
	return out
}
