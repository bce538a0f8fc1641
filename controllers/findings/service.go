package findings

import (
	"slices"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// LabelServiceProxyName on a Service, with any value, hands it to another
// proxy: neither kube-proxy nor proxyshift serves it, so no finding names
// it. (The agent's model package reads the same label; the operator does
// not import the agent's packages.)
const LabelServiceProxyName = "service.kubernetes.io/service-proxy-name"

// Trim returns the part of a Service the rules read: its identity and
// resourceVersion, the service-proxy-name label, and the spec fields below.
// It is the operator's cache transform for Services, so that a cluster's
// Services cost the operator little memory.
func Trim(svc *corev1.Service) *corev1.Service {
	s := &svc.Spec
	ports := make([]corev1.ServicePort, len(s.Ports))
	for i, p := range s.Ports {
		ports[i] = corev1.ServicePort{NodePort: p.NodePort}
	}
	var lbl map[string]string
	if v, ok := svc.Labels[LabelServiceProxyName]; ok {
		lbl = map[string]string{LabelServiceProxyName: v}
	}
	return &corev1.Service{
		TypeMeta: svc.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{Name: svc.Name, Namespace: svc.Namespace, UID: svc.UID, ResourceVersion: svc.ResourceVersion,
			Labels: lbl, DeletionTimestamp: svc.DeletionTimestamp},
		Spec: corev1.ServiceSpec{
			Type: s.Type, ClusterIP: s.ClusterIP, IPFamilies: s.IPFamilies, Ports: ports, ExternalIPs: s.ExternalIPs,
			ExternalTrafficPolicy: s.ExternalTrafficPolicy,
			SessionAffinity:       s.SessionAffinity, LoadBalancerSourceRanges: s.LoadBalancerSourceRanges,
		},
	}
}

// served: kube-proxy and proxyshift serve the Service.
func served(svc *corev1.Service) bool {
	_, other := svc.Labels[LabelServiceProxyName]
	return !other
}

// hasClusterIP: the Service has a cluster IP (it is not headless and not
// an ExternalName).
func hasClusterIP(svc *corev1.Service) bool {
	return svc.Spec.ClusterIP != "" && svc.Spec.ClusterIP != corev1.ClusterIPNone
}

// isLoadBalancer: the Service is of type LoadBalancer.
func isLoadBalancer(svc *corev1.Service) bool {
	return svc.Spec.Type == corev1.ServiceTypeLoadBalancer
}

// localExternalPolicy: externalTrafficPolicy Local.
func localExternalPolicy(svc *corev1.Service) bool {
	return svc.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal
}

// hasNodePort: some port has a node port.
func hasNodePort(svc *corev1.Service) bool {
	return slices.ContainsFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool { return p.NodePort != 0 })
}

// hasIPv4NodePort: some port has a node port and the Service has IPv4
// (an unset ipFamilies is the cluster's default family, taken as IPv4).
func hasIPv4NodePort(svc *corev1.Service) bool {
	v4 := len(svc.Spec.IPFamilies) == 0 || slices.Contains(svc.Spec.IPFamilies, corev1.IPv4Protocol)
	return v4 && hasNodePort(svc)
}

// hasExternalAddress: the Service is of type LoadBalancer or has
// external IPs.
func hasExternalAddress(svc *corev1.Service) bool {
	return isLoadBalancer(svc) || len(svc.Spec.ExternalIPs) > 0
}

// clientIPAffinity: sessionAffinity ClientIP.
func clientIPAffinity(svc *corev1.Service) bool {
	return svc.Spec.SessionAffinity == corev1.ServiceAffinityClientIP
}

// hasSourceRanges: a LoadBalancer Service with loadBalancerSourceRanges.
func hasSourceRanges(svc *corev1.Service) bool {
	return isLoadBalancer(svc) && len(svc.Spec.LoadBalancerSourceRanges) > 0
}
