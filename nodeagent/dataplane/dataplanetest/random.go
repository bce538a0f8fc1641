package dataplanetest

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/proxyshift/proxyshift/nodeagent/model"
)

// RandomModel returns a model of n service ports in each family, every
// feature drawn from r: protocol, node port, external and load-balancer
// IPs (some shared between ports), source ranges, traffic policies,
// ClientIP affinity, and 0-4 endpoints (one address per port, ports in order) in any
// condition, local or not.
// Addresses come from 198.18.0.0/15 and 2001:db8::/32. The backends'
// kernel tests program a sample of seeds and check that the kernel takes
// each ruleset and holds what was rendered.
func RandomModel(r *rand.Rand, n int) *model.Snapshot {
	m := &model.Snapshot{Ports: map[corev1.IPFamily]map[model.ServicePortName]*model.ServicePort{}}
	for _, fam := range []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol} {
		addr := func(block, i int) netip.Addr {
			if fam == corev1.IPv6Protocol {
				return netip.MustParseAddr(fmt.Sprintf("2001:db8:%x::%x", block, i+1))
			}
			return netip.AddrFrom4([4]byte{198, byte(18 + block/256), byte(block % 256), byte(i + 1)})
		}
		ports := map[model.ServicePortName]*model.ServicePort{}
		for i := range n {
			proto := []corev1.Protocol{corev1.ProtocolTCP, corev1.ProtocolUDP, corev1.ProtocolSCTP}[r.IntN(3)]
			sp := &model.ServicePort{
				Name:      model.ServicePortName{Namespace: "ns", Name: fmt.Sprintf("svc-%d", i), Port: "p", Protocol: proto},
				Family:    fam,
				ClusterIP: addr(1, i),
				Protocol:  proto,
				Port:      int32(1 + r.IntN(65535)),
			}
			if r.IntN(2) == 0 {
				sp.NodePort = int32(30000 + i)
			}
			if r.IntN(3) == 0 {
				sp.ExternalIPs = []netip.Addr{addr(2, r.IntN(4))}
			}
			if r.IntN(3) == 0 {
				sp.LoadBalancerIPs = []netip.Addr{addr(3, r.IntN(4))}
				if r.IntN(2) == 0 {
					sp.LoadBalancerSourceRanges = []netip.Prefix{netip.PrefixFrom(addr(4, 0), addr(4, 0).BitLen()-8).Masked()}
				}
			}
			sp.ExternalPolicyLocal = r.IntN(4) == 0
			sp.InternalPolicyLocal = r.IntN(4) == 0
			if r.IntN(4) == 0 {
				sp.AffinityTimeout = time.Duration(1+r.IntN(3600)) * time.Second
			}
			for j := range r.IntN(5) {
				ready := r.IntN(4) != 0
				sp.Endpoints = append(sp.Endpoints, model.Endpoint{
					IP: addr(5+i/200, i%200), Port: int32(8000 + j),
					Ready: ready, Serving: ready || r.IntN(2) == 0, Terminating: !ready && r.IntN(2) == 0,
					IsLocal: r.IntN(2) == 0,
				})
			}
			ports[sp.Name] = sp
		}
		m.Ports[fam] = ports
	}
	return m
}
