package agent

import (
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
// cache stores it, so it is never kept.

// trimObject is the informers' transform: it keeps of a Service and an
// EndpointSlice only what the model and the agent's events read, and
// passes anything else (a tombstone, say) through unchanged. It modifies
// the object it is given, which the informer has just decoded and nobody
// else holds yet.
func trimObject(obj any) (any, error) {
	switch o := obj.(type) {
	case *corev1.Service:
		trimService(o)
	case *discoveryv1.EndpointSlice:
		trimEndpointSlice(o)
	}
	return obj, nil
}

// trimService keeps the Service's identity (events name it), the one
// label the model reads, its spec without the pod selector, and the
// load-balancer addresses of its status.
func trimService(svc *corev1.Service) {
	trimMeta(&svc.ObjectMeta, model.LabelServiceProxyName, "")
	svc.Spec.Selector = nil
	svc.Status.Conditions = nil
	for i := range svc.Status.LoadBalancer.Ingress {
		svc.Status.LoadBalancer.Ingress[i].Ports = nil
	}
}

// trimEndpointSlice keeps the slice's identity, the label naming its
// Service, the trigger-time annotation (for the programming latency), its
// ports, and of each endpoint the addresses, conditions, node, zone and
// hints.
func trimEndpointSlice(s *discoveryv1.EndpointSlice) {
	trimMeta(&s.ObjectMeta, discoveryv1.LabelServiceName, corev1.EndpointsLastChangeTriggerTime)
	for i := range s.Endpoints {
		e := &s.Endpoints[i]
		e.TargetRef, e.Hostname, e.DeprecatedTopology = nil, nil, nil
	}
}

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

// keepKey returns a map holding only key's entry of m (nil without it).
func keepKey(m map[string]string, key string) map[string]string {
	v, ok := m[key]
	if !ok || key == "" {
		return nil
	}
	return map[string]string{key: v}
}
