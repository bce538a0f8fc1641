package agent

import (
	"slices"
	"unique"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/proxyshift/proxyshift/nodeagent/model"
)

// The informer caches hold every Service and EndpointSlice of the
// cluster for as long as the agent runs, and the model tracker keeps
// pointers to the same objects (no copy). Most of what the API server
// sends is never read by the agent: managedFields alone are often the
// largest part of an object, and an endpoint's targetRef names the pod
// behind it. trimObject drops it as each object is decoded, before the
// cache stores it, so it is never kept; an EndpointSlice is kept as the
// model.Slice of it, 40 bytes an endpoint where the API type takes 96.

// trimObject is the informers' transform: it keeps of a Service and an
// EndpointSlice only what the model and the agent's events read, and
// passes anything else (a tombstone, say) through unchanged. It modifies
// the object it is given, which the informer has just decoded and nobody
// else holds yet, and returns an EndpointSlice as a *model.Slice: the
// informer's store and its handlers get that.
func trimObject(obj any) (any, error) {
	switch o := obj.(type) {
	case *corev1.Service:
		trimService(o)
	case *discoveryv1.EndpointSlice:
		return compactSlice(o), nil
	}
	return obj, nil
}

// trimService keeps the Service's identity (events name it), the one
// label the model reads, its spec without the pod selector, and the
// load-balancer addresses of its status; see share for the spec's
// strings.
func trimService(svc *corev1.Service) {
	trimMeta(&svc.ObjectMeta, model.LabelServiceProxyName, "")
	sp := &svc.Spec
	sp.Selector = nil
	sp.Type = share(sp.Type)
	sp.SessionAffinity = share(sp.SessionAffinity)
	sp.ExternalTrafficPolicy = share(sp.ExternalTrafficPolicy)
	sp.InternalTrafficPolicy = sharePtr(sp.InternalTrafficPolicy, internalPolicies...)
	sp.IPFamilyPolicy = sharePtr(sp.IPFamilyPolicy, familyPolicies...)
	for i := range sp.IPFamilies {
		sp.IPFamilies[i] = share(sp.IPFamilies[i])
	}
	if len(sp.ClusterIPs) > 0 && sp.ClusterIPs[0] == sp.ClusterIP {
		sp.ClusterIPs[0] = sp.ClusterIP
	}
	for i := range sp.Ports {
		p := &sp.Ports[i]
		p.Name, p.Protocol, p.TargetPort.StrVal = share(p.Name), share(p.Protocol), share(p.TargetPort.StrVal)
	}
	svc.Status.Conditions = nil
	for i := range svc.Status.LoadBalancer.Ingress {
		svc.Status.LoadBalancer.Ingress[i].Ports = nil
	}
}

// compactSlice returns what the model reads of an EndpointSlice (see
// model.Slice): its identity, the label naming its Service, the
// trigger-time annotation (for the programming latency), its ports, and
// of each endpoint the first address, conditions, node and hints (the
// zone of an endpoint decides nothing: its hints do). The decoded slice
// is left to the collector.
func compactSlice(s *discoveryv1.EndpointSlice) *model.Slice {
	trimMeta(&s.ObjectMeta, discoveryv1.LabelServiceName, corev1.EndpointsLastChangeTriggerTime)
	s.AddressType = share(s.AddressType)
	for i := range s.Endpoints {
		if h := s.Endpoints[i].Hints; h != nil {
			for j := range h.ForZones {
				h.ForZones[j].Name = share(h.ForZones[j].Name)
			}
			for j := range h.ForNodes {
				h.ForNodes[j].Name = share(h.ForNodes[j].Name)
			}
		}
	}
	for i := range s.Ports {
		p := &s.Ports[i]
		shareIn(p.Name)
		p.Protocol = sharePtr(p.Protocol, protocols...)
	}
	shareNodeNames(s.Endpoints)
	return model.SliceOf(s)
}

// shareNodeNames makes the endpoints of a slice on one node point to one
// copy of its name: the decoder allocates a pointer for each.
func shareNodeNames(eps []discoveryv1.Endpoint) {
	var seen []*string
	for i := range eps {
		p := eps[i].NodeName
		if p == nil {
			continue
		}
		*p = share(*p)
		if j := slices.IndexFunc(seen, func(q *string) bool { return *q == *p }); j >= 0 {
			eps[i].NodeName = seen[j]
		} else {
			seen = append(seen, p)
		}
	}
}

// Each object decoded from the API server carries its own copy of every
// string in it, and its own pointer to every optional field: the same
// "TCP", "Cluster" or node name as many times as objects name it. share
// and its kin make the objects the cache keeps point to one copy of each
// instead. Strings go through
// Go's unique package, which keeps one copy of each string while any
// object refers to it (so names of nodes long gone do not pile up);
// pointers to the values the API defines point to one variable per
// value. Nothing writes through them: the cache's objects are read-only
// to everyone. Addresses are each their own, but a slice's are packed
// into one string (model.SliceOf).

// share returns s, its bytes shared with every other string shared with
// the same contents.
func share[S ~string](s S) S {
	if s == "" {
		return s
	}
	return S(unique.Make(string(s)).Value())
}

// shareIn shares the string p points to in place (see share).
func shareIn[S ~string](p *S) {
	if p != nil {
		*p = share(*p)
	}
}

// sharePtr returns the one of known that holds *p's value, or p when
// none does (nil for nil).
func sharePtr[T comparable](p *T, known ...*T) *T {
	if p == nil {
		return nil
	}
	for _, k := range known {
		if *k == *p {
			return k
		}
	}
	return p
}

// The values the API defines for the pointer fields the agent keeps.
var (
	protoTCP, protoUDP, protoSCTP    = corev1.ProtocolTCP, corev1.ProtocolUDP, corev1.ProtocolSCTP
	protocols                        = []*corev1.Protocol{&protoTCP, &protoUDP, &protoSCTP}
	policyCluster, policyLocal       = corev1.ServiceInternalTrafficPolicyCluster, corev1.ServiceInternalTrafficPolicyLocal
	internalPolicies                 = []*corev1.ServiceInternalTrafficPolicy{&policyCluster, &policyLocal}
	singleStack, preferDual, reqDual = corev1.IPFamilyPolicySingleStack, corev1.IPFamilyPolicyPreferDualStack, corev1.IPFamilyPolicyRequireDualStack
	familyPolicies                   = []*corev1.IPFamilyPolicy{&singleStack, &preferDual, &reqDual}
)

// trimMeta keeps an object's name, namespace, UID, resource version and
// creation time (the oldest Service wins an external address both claim),
// the label label and the annotation annotation ("" for none).
func trimMeta(m *metav1.ObjectMeta, label, annotation string) {
	*m = metav1.ObjectMeta{
		Name:              m.Name,
		Namespace:         m.Namespace,
		UID:               m.UID,
		ResourceVersion:   m.ResourceVersion,
		Generation:        m.Generation,
		CreationTimestamp: m.CreationTimestamp,
		Labels:            keepKey(m.Labels, label),
		Annotations:       keepKey(m.Annotations, annotation),
	}
}

// keepKey returns m holding only key's entry (nil without it). A map of
// up to 8 entries, all in one group of Go's map (whose room never
// shrinks), is emptied and reused: the common case, and no new map for
// each of 20 000 objects at 10 000 services. A larger one is replaced
// by a new map, which does not keep its room. Either way the entry's key
// is the caller's string, not the decoded copy of it.
func keepKey(m map[string]string, key string) map[string]string {
	v, ok := m[key]
	if !ok || key == "" {
		return nil
	}
	if len(m) > 8 {
		return map[string]string{key: v}
	}
	clear(m)
	m[key] = v
	return m
}
