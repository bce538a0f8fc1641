package healthcheck

import (
	"cmp"
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"

	"github.com/proxyshift/proxyshift/api/contract"
	"github.com/proxyshift/proxyshift/api/v1alpha1"
	"github.com/proxyshift/proxyshift/nodeagent/model"
	"github.com/proxyshift/proxyshift/nodeagent/report"
)

// ToBeDeletedTaint is the taint the cluster autoscaler puts on a node it
// is about to delete; kube-proxy's /healthz fails on such a node so load
// balancers stop sending it new connections.
const ToBeDeletedTaint = "ToBeDeletedByClusterAutoscaler"

// CheckKey names one health check: a Service in one IP family. A
// dual-stack Service has one per family, on the same port.
type CheckKey struct {
	Service model.ServiceName
	Family  corev1.IPFamily
}

// Check is one Service's health-check node port in one IP family, with
// what it answers.
type Check struct {
	CheckKey
	Port int32
	// LocalEndpoints counts the distinct addresses of the Service's ready
	// endpoints on this node, over all its ports, as kube-proxy counts
	// them: terminating endpoints do not count even while they still
	// serve, so a node left with only those fails the check.
	LocalEndpoints int
}

// Checks computes the health checks a snapshot asks for: one per Service
// and family whose ports carry a health-check node port (the API server
// sets one only on LoadBalancer Services with externalTrafficPolicy
// Local). They are sorted by family, namespace and name.
func Checks(snap *model.Snapshot) []Check {
	if snap == nil {
		return nil
	}
	type acc struct {
		port int32
		ips  map[netip.Addr]struct{}
	}
	byKey := map[CheckKey]*acc{}
	for fam, ports := range snap.Ports {
		for _, sp := range ports {
			if sp.HealthCheckNodePort == 0 {
				continue
			}
			k := CheckKey{Service: sp.Name.ServiceName(), Family: fam}
			a := byKey[k]
			if a == nil {
				a = &acc{port: sp.HealthCheckNodePort, ips: map[netip.Addr]struct{}{}}
				byKey[k] = a
			}
			for _, e := range sp.LocalEndpoints() {
				if e.Ready {
					a.ips[e.IP] = struct{}{}
				}
			}
		}
	}
	out := make([]Check, 0, len(byKey))
	for k, a := range byKey {
		out = append(out, Check{CheckKey: k, Port: a.port, LocalEndpoints: len(a.ips)})
	}
	slices.SortFunc(out, func(a, b Check) int {
		return cmp.Or(cmp.Compare(a.Family, b.Family), cmp.Compare(a.Service.Namespace, b.Service.Namespace), cmp.Compare(a.Service.Name, b.Service.Name))
	})
	return out
}

// ListenAddrs are the addresses a health check of family listens on: the
// node's NodePort addresses of that family (nodePortAddresses resolved,
// see agent.NodePortIPs), or, when they are not restricted (nil), the
// family's wildcard address. A family none of the NodePort addresses
// belongs to gets no listener: its checks are not reachable on this
// node, as its NodePorts are not.
func ListenAddrs(family corev1.IPFamily, nodeIPs []netip.Addr, port int32) []netip.AddrPort {
	if nodeIPs == nil {
		wild := netip.IPv4Unspecified()
		if family == corev1.IPv6Protocol {
			wild = netip.IPv6Unspecified()
		}
		return []netip.AddrPort{netip.AddrPortFrom(wild, uint16(port))}
	}
	var out []netip.AddrPort
	for _, ip := range nodeIPs {
		if ip.Is6() == (family == corev1.IPv6Protocol) {
			out = append(out, netip.AddrPortFrom(ip, uint16(port)))
		}
	}
	slices.SortFunc(out, netip.AddrPort.Compare)
	return out
}

// NodeEligible says whether the node should get new load-balanced
// connections, as kube-proxy's /healthz decides: not when its Node is
// unknown, being deleted, or tainted ToBeDeletedByClusterAutoscaler.
func NodeEligible(node *corev1.Node) bool {
	if node == nil || node.DeletionTimestamp != nil {
		return false
	}
	for _, t := range node.Spec.Taints {
		if t.Key == ToBeDeletedTaint {
			return false
		}
	}
	return true
}

// Serving says whether proxyshift serves the node in kube-proxy's place,
// so that the ports kube-proxy owns are proxyshift's to bind: a
// proxyshift mode serves (during a switch between proxyshift modes the
// one that served before still does); the node is not being handed back
// to kube-proxy (from the first phase of a hand-back, kube-proxy's pod
// may come back and bind them); and kube-proxy is gone: its objects are
// not in the kernel, or the operator said its pod left
// (spec.kubeProxyStopped).
func Serving(sw report.Switch, kubeProxyStopped bool) bool {
	return contract.ValidMode(sw.Active) && sw.Target != v1alpha1.ModeKubeProxy &&
		sw.Phase != v1alpha1.NodeWaitingForKubeProxy &&
		(sw.KubeProxyMode == "" || kubeProxyStopped)
}
