package dataplanetest

import (
	"net/netip"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/proxyshift/proxyshift/nodeagent/dataplane"
	"github.com/proxyshift/proxyshift/nodeagent/model"
)

// Scenario is one kind of service, as each backend renders it into its
// golden file testdata/<Name>.golden: the same service ports on the same
// node for every backend, so that the three can be read side by side.
type Scenario struct {
	Name   string
	Family corev1.IPFamily
	Config dataplane.NodeConfig
	Ports  []*model.ServicePort
}

// The nodes the scenarios render for.
var (
	// Node is the configuration most scenarios render for: pod networks
	// in both families, NodePorts on every local address, a primary
	// address in each family.
	Node = dataplane.NodeConfig{
		NodeName:      "node-a",
		PrimaryIPs:    Addrs("192.168.1.10", "2001:db8::10"),
		ClusterCIDRs:  []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("fd00:10:244::/56")},
		MasqueradeBit: 14,
	}
	// NodeWithIPs is Node with NodePort addresses in both families.
	NodeWithIPs = func() dataplane.NodeConfig {
		c := Node
		c.NodeIPs = Addrs("192.168.1.10", "2001:db8::10")
		return c
	}()
	// MasqueradeAllNode masquerades everything and has no pod networks.
	MasqueradeAllNode = func() dataplane.NodeConfig {
		c := Node
		c.MasqueradeAll, c.ClusterCIDRs = true, nil
		return c
	}()
)

// Scenarios are the golden scenarios, one a kind of service.
func Scenarios() []Scenario {
	v4, v6 := corev1.IPv4Protocol, corev1.IPv6Protocol
	return []Scenario{
		{"clusterip", v4, Node, []*model.ServicePort{
			Svc("default", "web", "http", "10.96.0.10", 80, EP("10.244.1.2", 8080), EP("10.244.2.3", 8080), EP("10.244.3.4", 8080)),
		}},
		{"nodeport", v4, NodeWithIPs, []*model.ServicePort{
			Svc("default", "web", "http", "10.96.0.10", 80, NodePort(30080), EP("10.244.1.2", 8080), EP("10.244.2.3", 8080, Local)),
		}},
		{"loadbalancer-source-ranges", v4, NodeWithIPs, []*model.ServicePort{
			Svc("shop", "front", "https", "10.96.0.20", 443, NodePort(30443), LB("198.18.100.1"),
				SourceRanges("203.0.113.0/24", "192.168.1.0/24"), EP("10.244.1.2", 8443)),
		}},
		{"externalips", v4, Node, []*model.ServicePort{
			Svc("default", "dns", "dns", "10.96.0.53", 53, UDP, ExternalIPs("198.18.50.5"), EP("10.244.1.7", 53)),
		}},
		{"etp-local", v4, NodeWithIPs, []*model.ServicePort{
			Svc("default", "ingress", "http", "10.96.0.80", 80, NodePort(30081), LB("198.18.100.2"), ETPLocal,
				EP("10.244.1.2", 8080), EP("10.244.2.3", 8080, Local)),
		}},
		{"etp-local-no-local-endpoints", v4, NodeWithIPs, []*model.ServicePort{
			Svc("default", "ingress", "http", "10.96.0.80", 80, NodePort(30081), LB("198.18.100.2"), ETPLocal, EP("10.244.1.2", 8080)),
		}},
		{"itp-local", v4, Node, []*model.ServicePort{
			Svc("default", "node-cache", "dns", "10.96.0.11", 53, UDP, ITPLocal, EP("10.244.1.2", 53)),
			Svc("default", "node-agent", "metrics", "10.96.0.12", 9100, ITPLocal, EP("10.244.1.3", 9100), EP("10.244.2.3", 9100, Local)),
		}},
		{"itp-local-no-local-endpoints", v4, NodeWithIPs, []*model.ServicePort{
			Svc("default", "node-local", "http", "10.96.0.81", 80, ITPLocal, EP("10.244.2.9", 8080)),
		}},
		{"affinity", v4, Node, []*model.ServicePort{
			Svc("default", "session", "http", "10.96.0.30", 80, Affinity(3*time.Hour), EP("10.244.1.2", 8080), EP("10.244.2.3", 8080)),
		}},
		{"no-endpoints", v4, Node, []*model.ServicePort{
			Svc("default", "empty", "http", "10.96.0.40", 80, NodePort(30040), ExternalIPs("198.18.50.6"), LB("198.18.100.3")),
		}},
		{"terminating-fallback", v4, Node, []*model.ServicePort{
			Svc("default", "rollout", "http", "10.96.0.50", 80, EP("10.244.1.2", 8080, Terminating), EP("10.244.2.3", 8080, Terminating, NotServing)),
		}},
		{"terminating", v4, Node, []*model.ServicePort{
			// .11 drains; .12 is terminating and no longer serving: it
			// drains too.
			Svc("default", "rollout", "http", "10.96.0.90", 80, EP("10.244.1.10", 8080),
				EP("10.244.1.11", 8080, Terminating), EP("10.244.1.12", 8080, Terminating, NotServing)),
			// Nothing ready: the serving terminating endpoint serves.
			Svc("default", "fallback", "http", "10.96.0.91", 80, EP("10.244.1.13", 8080, Terminating),
				EP("10.244.1.14", 8080, Terminating, NotServing)),
		}},
		{"masquerade-all", v4, MasqueradeAllNode, []*model.ServicePort{
			Svc("default", "web", "http", "10.96.0.10", 80, EP("10.244.1.2", 8080)),
		}},
		{"shared-external-ip", v4, Node, []*model.ServicePort{
			// Both want 198.18.50.8:80; "a" is first by name and keeps it,
			// "b" keeps its cluster IP.
			Svc("default", "a", "http", "10.96.0.60", 80, ExternalIPs("198.18.50.8"), EP("10.244.1.20", 8080)),
			Svc("default", "b", "http", "10.96.0.61", 80, ExternalIPs("198.18.50.8"), EP("10.244.1.21", 8080)),
		}},
		{"ipv6", v6, NodeWithIPs, []*model.ServicePort{
			Svc("default", "web", "http", "fd00:10:96::10", 80, NodePort(30080), EP("fd00:10:244:1::2", 8080), EP("fd00:10:244:2::3", 8080, Local)),
		}},
	}
}
