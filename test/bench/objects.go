package bench

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
)

// NodeName is the Node both programs proxy for.
const NodeName = "bench-node"

// namespace holds the benchmark's Services.
const namespace = "default"

// managedBy is the managed-by label of the benchmark's EndpointSlices.
const managedBy = "proxyshift-bench"

// ProbeServices is how many Services (the first ones) have a single
// endpoint, which the endpoint changes move: a connection to such a
// Service reaches its new endpoint exactly when the change is programmed.
// Every other Service has EndpointsPerService endpoints.
const ProbeServices = 60

// EndpointsPerService is the endpoint count of every other Service.
const EndpointsPerService = 10

// Endpoint addresses: the lower half of EndpointCIDR for the fixed
// endpoints of ordinary Services, the upper half for the addresses the
// endpoint changes hand out.
var (
	fixedPool = netip.PrefixFrom(EndpointCIDR.Addr(), EndpointCIDR.Bits()+1)
	freshPool = netip.PrefixFrom(nthAddr(EndpointCIDR.Addr(), 1<<(32-EndpointCIDR.Bits()-1)), EndpointCIDR.Bits()+1)
)

// Objects creates and changes the benchmark's Node, Services and
// EndpointSlices.
type Objects struct {
	kube  kubernetes.Interface
	count int // Services created so far

	mu    sync.Mutex
	fresh int // fresh addresses handed out so far
	// versions are the resource versions of the probe Services'
	// EndpointSlices after their last move, by Service index.
	versions map[int]string
}

// NewObjects creates the Node (with NodeIP as its InternalIP, which
// kube-proxy waits for).
func NewObjects(ctx context.Context, kube kubernetes.Interface) (*Objects, error) {
	node, err := kube.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: NodeName}}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("create Node: %w", err)
	}
	node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: NodeIP.String()}}
	if _, err := kube.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		return nil, fmt.Errorf("set the Node's InternalIP: %w", err)
	}
	return &Objects{kube: kube, versions: map[int]string{}}, nil
}

// Remove deletes what the benchmark created: its Services, their
// EndpointSlices and the Node, so that an API server shared with other
// tests (the test VM's) is left as it was found.
func (o *Objects) Remove(ctx context.Context) error {
	var errs []error
	for i := range o.count {
		if err := o.kube.CoreV1().Services(namespace).Delete(ctx, ServiceName(i), metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, err)
		}
	}
	selector := metav1.ListOptions{LabelSelector: discoveryv1.LabelManagedBy + "=" + managedBy}
	if err := o.kube.DiscoveryV1().EndpointSlices(namespace).DeleteCollection(ctx, metav1.DeleteOptions{}, selector); err != nil {
		errs = append(errs, err)
	}
	if err := o.kube.CoreV1().Nodes().Delete(ctx, NodeName, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Count is the number of Services created.
func (o *Objects) Count() int { return o.count }

// ServiceName is the i-th Service's name.
func ServiceName(i int) string { return fmt.Sprintf("svc-%05d", i) }

// ServiceAddr is the i-th Service's cluster IP and port.
func ServiceAddr(i int) netip.AddrPort {
	return netip.AddrPortFrom(nthAddr(ServiceCIDR.Addr(), 256+i), 80)
}

// FirstOrdinary and LastOrdinary are the first and the last Service with
// EndpointsPerService endpoints once n exist.
func FirstOrdinary() int     { return ProbeServices }
func LastOrdinary(n int) int { return n - 1 }

// EnsureServices creates Services (with their EndpointSlices) until n
// exist, with workers concurrent writers.
func (o *Objects) EnsureServices(ctx context.Context, n, workers int) error {
	if n <= ProbeServices {
		return fmt.Errorf("need more than %d Services", ProbeServices)
	}
	next := make(chan int)
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := o.createService(ctx, i); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	var err error
feed:
	for i := o.count; i < n; i++ {
		select {
		case next <- i:
		case err = <-errs:
			break feed
		}
	}
	close(next)
	wg.Wait()
	if err == nil {
		select {
		case err = <-errs:
		default:
		}
	}
	if err != nil {
		return err
	}
	o.count = n
	return nil
}

func (o *Objects) createService(ctx context.Context, i int) error {
	addr := ServiceAddr(i)
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: ServiceName(i), Namespace: namespace},
		Spec: corev1.ServiceSpec{
			ClusterIP: addr.Addr().String(),
			Ports:     []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: int32(addr.Port()), TargetPort: intstr.FromInt32(EndpointPort)}},
		},
	}
	if _, err := o.kube.CoreV1().Services(namespace).Create(ctx, svc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create Service %s: %w", svc.Name, err)
	}
	var eps []netip.Addr
	if i < ProbeServices {
		eps = []netip.Addr{o.nextFresh()}
	} else {
		for e := range EndpointsPerService {
			eps = append(eps, nthAddr(fixedPool.Addr(), ((i-ProbeServices)*EndpointsPerService+e)%(1<<(32-fixedPool.Bits()))))
		}
	}
	if _, err := o.kube.DiscoveryV1().EndpointSlices(namespace).Create(ctx, slice(i, eps), metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create EndpointSlice of %s: %w", svc.Name, err)
	}
	return nil
}

// nextFresh hands out an endpoint address no endpoint has had yet.
func (o *Objects) nextFresh() netip.Addr {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.fresh++
	return nthAddr(freshPool.Addr(), o.fresh%(1<<(32-freshPool.Bits())))
}

// MoveEndpoint replaces the single endpoint of probe Service i (i <
// ProbeServices) with a fresh address, as when its pod is rescheduled,
// and returns that address and when the write began: the latency of the
// change counts from there. The slice's resource version is read before
// (from the previous move, or the API server the first time), so that
// the clock starts at the write, not at a read a controller would not
// make.
func (o *Objects) MoveEndpoint(ctx context.Context, i int) (netip.Addr, time.Time, error) {
	ep := o.nextFresh()
	s := slice(i, []netip.Addr{ep})
	o.mu.Lock()
	s.ResourceVersion = o.versions[i]
	o.mu.Unlock()
	if s.ResourceVersion == "" {
		cur, err := o.kube.DiscoveryV1().EndpointSlices(namespace).Get(ctx, s.Name, metav1.GetOptions{})
		if err != nil {
			return netip.Addr{}, time.Time{}, err
		}
		s.ResourceVersion = cur.ResourceVersion
	}
	sent := time.Now()
	out, err := o.kube.DiscoveryV1().EndpointSlices(namespace).Update(ctx, s, metav1.UpdateOptions{})
	if err != nil {
		return netip.Addr{}, time.Time{}, err
	}
	o.mu.Lock()
	o.versions[i] = out.ResourceVersion
	o.mu.Unlock()
	return ep, sent, nil
}

func slice(i int, eps []netip.Addr) *discoveryv1.EndpointSlice {
	ready, portName, proto, port := true, "http", corev1.ProtocolTCP, int32(EndpointPort)
	s := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Name: ServiceName(i) + "-1", Namespace: namespace,
			Labels: map[string]string{discoveryv1.LabelServiceName: ServiceName(i), discoveryv1.LabelManagedBy: managedBy},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &portName, Protocol: &proto, Port: &port}},
	}
	for _, ep := range eps {
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{ep.String()}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}})
	}
	return s
}

// nthAddr is the IPv4 address n after base.
func nthAddr(base netip.Addr, n int) netip.Addr {
	b := base.As4()
	v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
	v += uint32(n)
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}
