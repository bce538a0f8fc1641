package agent

import (
	"fmt"
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
)

// NodePortIPs resolves nodePortAddresses to the node addresses NodePorts
// answer on. An empty spec means every local address and yields nil (the
// backends then match any local destination). "primary" yields the node's
// PrimaryIPs; CIDRs yield the local addresses inside them.
func NodePortIPs(spec []string, node *corev1.Node, local []netip.Addr) ([]netip.Addr, error) {
	if len(spec) == 0 {
		return nil, nil
	}
	if len(spec) == 1 && spec[0] == string(v1alpha1.NodePortAddressPrimary) {
		if node == nil {
			return nil, fmt.Errorf("nodePortAddresses is %q but this node's Node object is not known", v1alpha1.NodePortAddressPrimary)
		}
		ips := PrimaryIPs(node)
		if len(ips) == 0 {
			return nil, fmt.Errorf("nodePortAddresses is %q but Node %s has no InternalIP or ExternalIP", v1alpha1.NodePortAddressPrimary, node.Name)
		}
		return ips, nil
	}
	cidrs, err := nodePortCIDRs(spec)
	if err != nil {
		return nil, err
	}
	var ips []netip.Addr
	for _, ip := range local {
		if slices.ContainsFunc(cidrs, func(p netip.Prefix) bool { return p.Contains(ip.Unmap()) }) {
			ips = append(ips, ip.Unmap())
		}
	}
	if len(ips) == 0 {
		return nil, fmt.Errorf("no local address lies in nodePortAddresses %v", spec)
	}
	slices.SortFunc(ips, netip.Addr.Compare)
	return ips, nil
}

// PrimaryIPs are the node's primary addresses from its Node object, one
// per family: the family's first InternalIP, else its first ExternalIP.
// These are kube-proxy's node IPs (GetNodeHostIPs), which it uses for
// nodePortAddresses "primary" and to tell whether a
// loadBalancerSourceRange holds the node. None for a nil node.
func PrimaryIPs(node *corev1.Node) []netip.Addr {
	if node == nil {
		return nil
	}
	var ips []netip.Addr
	seen := map[bool]bool{} // by is-IPv4
	for _, t := range []corev1.NodeAddressType{corev1.NodeInternalIP, corev1.NodeExternalIP} {
		for _, a := range node.Status.Addresses {
			if a.Type != t {
				continue
			}
			ip, err := netip.ParseAddr(a.Address)
			if err != nil || seen[ip.Unmap().Is4()] {
				continue
			}
			seen[ip.Unmap().Is4()] = true
			ips = append(ips, ip.Unmap())
		}
	}
	return ips
}

// ValidNodePortAddresses checks nodePortAddresses as given to the agent's
// flag: empty, the single word primary, or CIDRs.
func ValidNodePortAddresses(spec []string) error {
	if len(spec) == 1 && spec[0] == string(v1alpha1.NodePortAddressPrimary) {
		return nil
	}
	_, err := nodePortCIDRs(spec)
	return err
}

// nodePortCIDRs parses nodePortAddresses that are not "primary".
func nodePortCIDRs(spec []string) ([]netip.Prefix, error) {
	var cidrs []netip.Prefix
	for _, s := range spec {
		p, err := v1alpha1.CIDR(s).Parse()
		if err != nil {
			return nil, fmt.Errorf("nodePortAddresses entry: %w (or %q alone)", err, v1alpha1.NodePortAddressPrimary)
		}
		cidrs = append(cidrs, p)
	}
	return cidrs, nil
}

// OwnAddrs are the addresses no Service may take as an external address
// on this node (see model.Refusal): the Node's InternalIPs and
// ExternalIPs, and the addresses NodePorts answer on. Other local
// addresses are left out on purpose: a load-balancer VIP that a component
// such as kube-vip puts on an interface is the Service's, not the node's.
func OwnAddrs(node *corev1.Node, nodePortIPs []netip.Addr) []netip.Addr {
	out := slices.Clone(nodePortIPs)
	if node != nil {
		for _, a := range node.Status.Addresses {
			if a.Type != corev1.NodeInternalIP && a.Type != corev1.NodeExternalIP {
				continue
			}
			if ip, err := netip.ParseAddr(a.Address); err == nil {
				out = append(out, ip.Unmap())
			}
		}
	}
	return out
}
