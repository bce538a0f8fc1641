package cluster

import (
	"context"
	"fmt"
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
	"github.com/proxyshift/proxyshift/test/netlab"
)

// The demo Services, in namespace ServicesNamespace. Each selects every
// pod of the cluster (its EndpointSlice lists them all, with their nodes),
// port ServicePort to the pods' netlab.ServerPort.
const (
	// ServiceWeb is a plain ClusterIP Service, TCP.
	ServiceWeb = "web"
	// ServiceNodePort is a NodePort Service, TCP, node port NodePort on
	// every node's fabric address.
	ServiceNodePort = "web-nodeport"
	// ServiceAffinity is a ClusterIP Service, TCP, with ClientIP session
	// affinity: one client keeps reaching the same pod.
	ServiceAffinity = "web-affinity"
	// ServiceUDP is a ClusterIP Service, UDP.
	ServiceUDP = "web-udp"

	ServicesNamespace = "default"
	ServicePort       = 80
	NodePort          = 30080
)

// ProxyshiftNamespace is where config/ installs proxyshift (as
// config/default names it): its ServiceAccounts and leader election.
const ProxyshiftNamespace = "proxyshift-system"

// managedBy marks the EndpointSlices the harness writes (no endpoint
// controller runs in the local cluster).
const managedBy = "localcluster.proxyshift.io"

// Service is one of the demo Services as the API server assigned it.
type Service struct {
	Name, Namespace string
	Type            corev1.ServiceType
	Protocol        netlab.Proto
	// ClusterIP is the Service's address in ServiceCIDR; Port its port.
	ClusterIP netip.Addr
	Port      int
	// NodePort is the node port (0 unless Type is NodePort).
	NodePort int
	// Affinity tells whether the Service has ClientIP session affinity.
	Affinity bool
	// SliceName is the EndpointSlice the harness writes for it.
	SliceName string
}

// ClusterAddr is the Service's cluster IP and port.
func (s *Service) ClusterAddr() netip.AddrPort {
	return netip.AddrPortFrom(s.ClusterIP, uint16(s.Port))
}

// NodePortAddr is the Service's node port on node n.
func (s *Service) NodePortAddr(n *Node) netip.AddrPort {
	return netip.AddrPortFrom(n.IP, uint16(s.NodePort))
}

type serviceSpec struct {
	name     string
	typ      corev1.ServiceType
	proto    corev1.Protocol
	nodePort int32
	affinity bool
}

var demoServices = []serviceSpec{
	{name: ServiceWeb, typ: corev1.ServiceTypeClusterIP, proto: corev1.ProtocolTCP},
	{name: ServiceNodePort, typ: corev1.ServiceTypeNodePort, proto: corev1.ProtocolTCP, nodePort: NodePort},
	{name: ServiceAffinity, typ: corev1.ServiceTypeClusterIP, proto: corev1.ProtocolTCP, affinity: true},
	{name: ServiceUDP, typ: corev1.ServiceTypeClusterIP, proto: corev1.ProtocolUDP},
}

// createObjects writes the Nodes (with their InternalIP in status), the
// ProxyNodes, and the demo Services with their EndpointSlices.
func (c *Cluster) createObjects(ctx context.Context) error {
	nodes := c.Kube.CoreV1().Nodes()
	for _, n := range c.Nodes {
		node, err := nodes.Create(ctx, &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: n.Name, Labels: map[string]string{
				corev1.LabelHostname: n.Name,
				corev1.LabelOSStable: "linux",
			}},
			Spec: corev1.NodeSpec{PodCIDR: n.PodCIDR.String(), PodCIDRs: []string{n.PodCIDR.String()}},
		}, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("create Node %s: %w", n.Name, err)
		}
		// No kubelet runs: the harness reports what a kubelet would.
		now := metav1.Now()
		node.Status = corev1.NodeStatus{
			Addresses: []corev1.NodeAddress{
				{Type: corev1.NodeInternalIP, Address: n.IP.String()},
				{Type: corev1.NodeHostName, Address: n.Name},
			},
			Conditions: []corev1.NodeCondition{{
				Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "LocalClusterNode",
				Message: "network namespace " + n.NS.Name, LastHeartbeatTime: now, LastTransitionTime: now,
			}},
		}
		if node, err = nodes.UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("Node %s status: %w", n.Name, err)
		}
		if !c.opts.NoProxyNodes {
			pn := &v1alpha1.ProxyNode{
				ObjectMeta: metav1.ObjectMeta{Name: n.Name, OwnerReferences: []metav1.OwnerReference{{
					APIVersion: "v1", Kind: "Node", Name: node.Name, UID: node.UID,
				}}},
				Spec: v1alpha1.ProxyNodeSpec{DesiredMode: c.opts.Mode},
			}
			if err := c.Client.Create(ctx, pn); err != nil {
				return fmt.Errorf("create ProxyNode %s: %w", n.Name, err)
			}
		}
	}
	if c.opts.NoServices {
		return nil
	}
	for _, spec := range demoServices {
		svc, err := c.createService(ctx, spec)
		if err != nil {
			return err
		}
		c.Services = append(c.Services, svc)
		if err := c.SetEndpoints(ctx, svc, c.Pods); err != nil {
			return err
		}
	}
	return nil
}

func (c *Cluster) createService(ctx context.Context, spec serviceSpec) (*Service, error) {
	obj := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: spec.name, Namespace: ServicesNamespace},
		Spec: corev1.ServiceSpec{
			Type:     spec.typ,
			Selector: map[string]string{"app": "web"}, // no Pods exist; the harness writes the EndpointSlice
			Ports: []corev1.ServicePort{{
				Name: "web", Protocol: spec.proto, Port: ServicePort,
				TargetPort: intstr.FromInt32(netlab.ServerPort), NodePort: spec.nodePort,
			}},
		},
	}
	if spec.affinity {
		obj.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
	}
	obj, err := c.Kube.CoreV1().Services(ServicesNamespace).Create(ctx, obj, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("create Service %s: %w", spec.name, err)
	}
	ip, err := netip.ParseAddr(obj.Spec.ClusterIP)
	if err != nil {
		return nil, fmt.Errorf("Service %s: cluster IP %q: %w", spec.name, obj.Spec.ClusterIP, err)
	}
	return &Service{
		Name: spec.name, Namespace: ServicesNamespace, Type: spec.typ,
		Protocol:  netlab.Proto(map[corev1.Protocol]string{corev1.ProtocolTCP: "tcp", corev1.ProtocolUDP: "udp"}[spec.proto]),
		ClusterIP: ip, Port: ServicePort, NodePort: int(obj.Spec.Ports[0].NodePort),
		Affinity: spec.affinity, SliceName: spec.name + "-local",
	}, nil
}

// SetEndpoints makes pods the Service's endpoints (all ready, each with
// its node's name), creating or replacing the EndpointSlice the harness
// keeps for it; an empty list leaves the Service without endpoints.
func (c *Cluster) SetEndpoints(ctx context.Context, svc *Service, pods []*Pod) error {
	proto := corev1.ProtocolTCP
	if svc.Protocol == netlab.UDP {
		proto = corev1.ProtocolUDP
	}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: svc.SliceName, Namespace: svc.Namespace, Labels: map[string]string{
			discoveryv1.LabelServiceName: svc.Name,
			discoveryv1.LabelManagedBy:   managedBy,
		}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("web"), Protocol: &proto, Port: ptr.To[int32](netlab.ServerPort)}},
	}
	for _, p := range pods {
		slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{p.IP.String()},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)},
			NodeName:   ptr.To(p.Node.Name),
			Hostname:   ptr.To(p.Name),
		})
	}
	slices := c.Kube.DiscoveryV1().EndpointSlices(svc.Namespace)
	old, err := slices.Get(ctx, svc.SliceName, metav1.GetOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("get EndpointSlice %s: %w", svc.SliceName, err)
	}
	if err != nil {
		if _, err := slices.Create(ctx, slice, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create EndpointSlice %s: %w", svc.SliceName, err)
		}
		return nil
	}
	slice.ResourceVersion = old.ResourceVersion
	if _, err := slices.Update(ctx, slice, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("update EndpointSlice %s: %w", svc.SliceName, err)
	}
	return nil
}
