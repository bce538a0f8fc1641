package model

import (
	"cmp"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	netutils "k8s.io/utils/net"
)

// LabelServiceProxyName marks a Service as handled by another service
// proxy; proxyshift, like kube-proxy, ignores every Service carrying it.
const LabelServiceProxyName = "service.kubernetes.io/service-proxy-name"

// DefaultAffinityTimeout is the ClientIP session affinity timeout of a
// Service that sets none.
const DefaultAffinityTimeout = 10800 * time.Second

// maxAffinityTimeout is the largest timeout the API accepts.
const maxAffinityTimeout = 86400 * time.Second

// FieldError describes one piece of a Service or of one of its
// EndpointSlices that the model skipped because it is malformed. Its text
// is a single log line naming the object, the field and the value.
type FieldError struct {
	Service ServiceName
	// Slice names the EndpointSlice the field belongs to; "" for a field
	// of the Service itself.
	Slice string
	// Field is the field's path within its object, e.g. spec.ports[1].port.
	Field string
	// Value is the offending value as text.
	Value string
	// Reason says what is wrong with it.
	Reason string
}

// Error renders the error as "service ns/name [endpointslice slice]: field
// "value": reason".
func (e *FieldError) Error() string {
	obj := "service " + e.Service.String()
	if e.Slice != "" {
		obj += " endpointslice " + e.Slice
	}
	return fmt.Sprintf("%s: %s %q: %s", obj, e.Field, e.Value, e.Reason)
}

// ShouldSkip says whether the service proxy ignores svc entirely, and why:
// headless Services, ExternalName Services and Services that name another
// service proxy get no ports in the model.
func ShouldSkip(svc *corev1.Service) (bool, string) {
	switch {
	case svc.Spec.Type == corev1.ServiceTypeExternalName:
		return true, "type ExternalName"
	case svc.Spec.ClusterIP == corev1.ClusterIPNone || svc.Spec.ClusterIP == "":
		return true, "headless (no cluster IP)"
	}
	if proxy, ok := svc.Labels[LabelServiceProxyName]; ok {
		return true, fmt.Sprintf("label %s=%q", LabelServiceProxyName, proxy)
	}
	return false, ""
}

// BuildServicePorts builds the model of one Service: a ServicePort for each
// of its ports in each of its IP families, with the endpoints of the given
// EndpointSlices. Slices of other services, of other address types and FQDN
// slices are ignored, so the caller may pass more than the service's own.
// node decides which endpoints are local and what their topology hints
// say about it.
//
// A skipped Service (see ShouldSkip) yields nothing. Malformed pieces of
// the Service or its slices are left out, each reported by one FieldError,
// and the rest is built as usual. The result is ordered by IP family, then
// by the order of spec.ports.
func BuildServicePorts(svc *corev1.Service, epSlices []*Slice, node Node) ([]*ServicePort, []error) {
	if svc == nil {
		return nil, []error{errors.New("model: nil Service")}
	}
	if skip, _ := ShouldSkip(svc); skip {
		return nil, nil
	}
	b := &builder{name: ServiceName{Namespace: svc.Namespace, Name: svc.Name}}
	families := b.clusterIPs(svc)
	ports := b.ports(svc)
	base := b.common(svc)
	endpoints := b.endpoints(svc, families, epSlices, node)

	var out []*ServicePort
	for _, fam := range families {
		for _, p := range ports {
			sp := base
			sp.Name = ServicePortName{Namespace: svc.Namespace, Name: svc.Name, Port: p.Name, Protocol: p.Protocol}
			sp.Family = fam.family
			sp.ClusterIP = fam.ip
			sp.Protocol = p.Protocol
			sp.Port = p.Port
			sp.NodePort = p.NodePort
			sp.ExternalIPs = fam.externalIPs
			sp.LoadBalancerIPs = fam.lbIPs
			sp.LoadBalancerSourceRanges = fam.sourceRanges
			sp.Endpoints = endpoints[fam.family][portKey{p.Name, p.Protocol}]
			out = append(out, &sp)
		}
	}
	return out, b.errs
}

// builder collects the FieldErrors of one BuildServicePorts call.
type builder struct {
	name ServiceName
	errs []error
}

func (b *builder) fail(slice, field, value, reason string) {
	b.errs = append(b.errs, &FieldError{Service: b.name, Slice: slice, Field: field, Value: value, Reason: reason})
}

// familyAddrs are the addresses of the Service in one IP family.
type familyAddrs struct {
	family       corev1.IPFamily
	ip           netip.Addr
	externalIPs  []netip.Addr
	lbIPs        []netip.Addr
	sourceRanges []netip.Prefix
}

// clusterIPs returns the Service's IP families, one per valid cluster IP,
// each with the external addresses of that family.
func (b *builder) clusterIPs(svc *corev1.Service) []*familyAddrs {
	ips, field := svc.Spec.ClusterIPs, func(i int) string { return fmt.Sprintf("spec.clusterIPs[%d]", i) }
	if len(ips) == 0 {
		ips, field = []string{svc.Spec.ClusterIP}, func(int) string { return "spec.clusterIP" }
	}
	var fams []*familyAddrs
	for i, s := range ips {
		f := field(i)
		ip, ok := parseIP(s)
		if !ok {
			b.fail("", f, s, "not an IP address")
			continue
		}
		fam := familyOf(ip)
		if i < len(svc.Spec.IPFamilies) && svc.Spec.IPFamilies[i] != fam {
			b.fail("", f, s, fmt.Sprintf("address is %s but spec.ipFamilies[%d] is %q", fam, i, svc.Spec.IPFamilies[i]))
			continue
		}
		if slices.ContainsFunc(fams, func(a *familyAddrs) bool { return a.family == fam }) {
			b.fail("", f, s, "second cluster IP of family "+string(fam))
			continue
		}
		fams = append(fams, &familyAddrs{family: fam, ip: ip})
	}
	for i, s := range svc.Spec.ExternalIPs {
		if ip, ok := b.ip(fmt.Sprintf("spec.externalIPs[%d]", i), s); ok {
			if fa := findFamily(fams, familyOf(ip)); fa != nil {
				fa.externalIPs = append(fa.externalIPs, ip)
			}
		}
	}
	for i, ing := range svc.Status.LoadBalancer.Ingress {
		// Hostname-only ingresses and Proxy-mode IPs are the load
		// balancer's business: traffic to them never reaches a node
		// with that destination.
		if ing.IP == "" || ing.IPMode != nil && *ing.IPMode == corev1.LoadBalancerIPModeProxy {
			continue
		}
		if ip, ok := b.ip(fmt.Sprintf("status.loadBalancer.ingress[%d].ip", i), ing.IP); ok {
			if fa := findFamily(fams, familyOf(ip)); fa != nil {
				fa.lbIPs = append(fa.lbIPs, ip)
			}
		}
	}
	for i, s := range svc.Spec.LoadBalancerSourceRanges {
		f := fmt.Sprintf("spec.loadBalancerSourceRanges[%d]", i)
		p, ok := parsePrefix(s)
		if !ok {
			b.fail("", f, s, "not a CIDR or IP address")
			continue
		}
		if fa := findFamily(fams, familyOf(p.Addr())); fa != nil {
			fa.sourceRanges = append(fa.sourceRanges, p)
		}
	}
	for _, fa := range fams {
		// A range covering everything is the same as no restriction.
		if slices.ContainsFunc(fa.sourceRanges, func(p netip.Prefix) bool { return p.Bits() == 0 }) {
			fa.sourceRanges = nil
		}
	}
	return fams
}

func (b *builder) ip(field, s string) (netip.Addr, bool) {
	ip, ok := parseIP(s)
	if !ok {
		b.fail("", field, s, "not an IP address")
	}
	return ip, ok
}

// ports returns the valid entries of spec.ports, with the protocol
// defaulted to TCP and invalid node ports cleared.
func (b *builder) ports(svc *corev1.Service) []corev1.ServicePort {
	var out []corev1.ServicePort
	for i, p := range svc.Spec.Ports {
		f := fmt.Sprintf("spec.ports[%d]", i)
		if p.Protocol == "" {
			p.Protocol = corev1.ProtocolTCP
		}
		switch {
		case !validProtocol(p.Protocol):
			b.fail("", f+".protocol", string(p.Protocol), "not TCP, UDP or SCTP")
			continue
		case !validPort(p.Port):
			b.fail("", f+".port", fmt.Sprint(p.Port), "not a port number (1-65535)")
			continue
		case slices.ContainsFunc(out, func(q corev1.ServicePort) bool { return q.Name == p.Name && q.Protocol == p.Protocol }):
			b.fail("", f+".name", p.Name, "duplicate port name for protocol "+string(p.Protocol))
			continue
		}
		if p.NodePort != 0 && !validPort(p.NodePort) {
			b.fail("", f+".nodePort", fmt.Sprint(p.NodePort), "not a port number (1-65535)")
			p.NodePort = 0
		}
		out = append(out, p)
	}
	return out
}

// common returns a ServicePort holding the fields every port of the
// Service shares.
func (b *builder) common(svc *corev1.Service) ServicePort {
	var sp ServicePort
	if svc.Spec.SessionAffinity == corev1.ServiceAffinityClientIP {
		sp.AffinityTimeout = DefaultAffinityTimeout
		if c := svc.Spec.SessionAffinityConfig; c != nil && c.ClientIP != nil && c.ClientIP.TimeoutSeconds != nil {
			t := time.Duration(*c.ClientIP.TimeoutSeconds) * time.Second
			if t > 0 && t <= maxAffinityTimeout {
				sp.AffinityTimeout = t
			} else {
				b.fail("", "spec.sessionAffinityConfig.clientIP.timeoutSeconds", fmt.Sprint(*c.ClientIP.TimeoutSeconds),
					"not 1-86400; using the default 10800")
			}
		}
	}
	sp.ExternalPolicyLocal = svc.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal
	sp.InternalPolicyLocal = svc.Spec.InternalTrafficPolicy != nil && *svc.Spec.InternalTrafficPolicy == corev1.ServiceInternalTrafficPolicyLocal
	if p := svc.Spec.HealthCheckNodePort; validPort(p) {
		sp.HealthCheckNodePort = p
	} else if p != 0 {
		b.fail("", "spec.healthCheckNodePort", fmt.Sprint(p), "not a port number (1-65535)")
	}
	return sp
}

// portKey matches a service port to EndpointSlice ports.
type portKey struct {
	name     string
	protocol corev1.Protocol
}

// endpoints merges the endpoints of the Service's slices per family and
// port, deduplicated by address and port and sorted.
func (b *builder) endpoints(svc *corev1.Service, fams []*familyAddrs, all []*Slice, node Node) map[corev1.IPFamily]map[portKey][]Endpoint {
	var own []*Slice
	for _, s := range all {
		if s != nil && s.Namespace == svc.Namespace && s.Labels[discoveryv1.LabelServiceName] == svc.Name &&
			findFamily(fams, corev1.IPFamily(s.AddressType)) != nil {
			own = append(own, s)
		}
	}
	// Merging in name order makes the choice between duplicates stable.
	slices.SortFunc(own, func(x, y *Slice) int { return strings.Compare(x.Name, y.Name) })

	// Each port's endpoints, in slice-name order, then sorted and rid of
	// duplicates (dedupe). A slice per port, made once at its largest
	// size, where a map per port cost about 3.5 KB a port of ten
	// endpoints at start-up (its growth) against 800 bytes kept.
	total := 0
	for _, s := range own {
		total += len(s.Endpoints)
	}
	out := map[corev1.IPFamily]map[portKey][]Endpoint{}
	for _, s := range own {
		fam := corev1.IPFamily(s.AddressType)
		ports := b.slicePorts(s)
		if len(ports) == 0 {
			continue
		}
		if out[fam] == nil {
			out[fam] = map[portKey][]Endpoint{}
		}
		for i := range s.Endpoints {
			ep, ok := b.endpoint(s, i, fam, node)
			if !ok {
				continue
			}
			for key, port := range ports {
				if out[fam][key] == nil {
					out[fam][key] = make([]Endpoint, 0, total)
				}
				ep.Port = port
				out[fam][key] = append(out[fam][key], ep)
			}
		}
	}
	for _, byPort := range out {
		for key, eps := range byPort {
			byPort[key] = dedupe(eps)
		}
	}
	return out
}

// dedupe sorts eps by address and port and keeps one endpoint of each:
// the one preferred (preference), of those the first in eps. It reuses
// eps.
func dedupe(eps []Endpoint) []Endpoint {
	slices.SortStableFunc(eps, func(x, y Endpoint) int {
		return cmp.Or(x.IP.Compare(y.IP), cmp.Compare(x.Port, y.Port))
	})
	kept := eps[:0]
	for i := 0; i < len(eps); {
		best, j := i, i+1
		for ; j < len(eps) && eps[j].IP == eps[i].IP && eps[j].Port == eps[i].Port; j++ {
			if preference(eps[j]) > preference(eps[best]) {
				best = j
			}
		}
		// len(kept) <= i <= best: eps[best] is read before it is written over.
		kept = append(kept, eps[best])
		i = j
	}
	return kept
}

// slicePorts returns the valid ports of an EndpointSlice by name and
// protocol.
func (b *builder) slicePorts(s *Slice) map[portKey]int32 {
	out := map[portKey]int32{}
	for i, p := range s.Ports {
		f := fmt.Sprintf("ports[%d]", i)
		key := portKey{protocol: corev1.ProtocolTCP}
		if p.Protocol != nil {
			key.protocol = *p.Protocol
		}
		switch {
		case p.Name == nil:
			b.fail(s.Name, f+".name", "<nil>", "missing port name")
			continue
		case p.Port == nil:
			b.fail(s.Name, f+".port", "<nil>", "missing port number")
			continue
		case !validPort(*p.Port):
			b.fail(s.Name, f+".port", fmt.Sprint(*p.Port), "not a port number (1-65535)")
			continue
		}
		key.name = *p.Name
		if _, dup := out[key]; dup {
			b.fail(s.Name, f+".name", key.name, "duplicate port name for protocol "+string(key.protocol))
			continue
		}
		out[key] = *p.Port
	}
	return out
}

// endpoint converts endpoint i of slice s, without its port.
func (b *builder) endpoint(s *Slice, i int, fam corev1.IPFamily, node Node) (Endpoint, bool) {
	e := s.Endpoints[i]
	// field is the path of the failing field (only a failure spends
	// the formatting: 100 000 endpoints at start-up at 10k services).
	field := func(suffix string) string { return fmt.Sprintf("endpoints[%d].addresses%s", i, suffix) }
	if !e.HasAddress {
		b.fail(s.Name, field(""), "", "no address")
		return Endpoint{}, false
	}
	// All addresses of an endpoint are the same backend; use the first,
	// as kube-proxy does.
	ip, ok := parseIP(e.Address)
	if !ok {
		b.fail(s.Name, field("[0]"), e.Address, "not an IP address")
		return Endpoint{}, false
	}
	if familyOf(ip) != fam {
		b.fail(s.Name, field("[0]"), e.Address, "not an address of the slice's type "+string(fam))
		return Endpoint{}, false
	}
	ep := Endpoint{
		IP:          ip,
		Ready:       e.Ready,
		Serving:     e.Serving,
		Terminating: e.Terminating,
		IsLocal:     node.Name != "" && deref(e.NodeName) == node.Name,
	}
	if h := e.Hints; h != nil {
		ep.ZoneHint = hintFor(h.ForZones, func(z discoveryv1.ForZone) bool { return z.Name == node.Zone })
		ep.NodeHint = hintFor(h.ForNodes, func(n discoveryv1.ForNode) bool { return n.Name == node.Name })
	}
	return ep, true
}

// hintFor resolves one kind of an endpoint's hints: NoHint without any,
// HintHere if one of them names this node (or its zone), else
// HintElsewhere. Like kube-proxy it compares names as they are, so a node
// without a zone label matches no zone hint a real controller writes.
func hintFor[H any](hints []H, namesThisNode func(H) bool) Hint {
	switch {
	case len(hints) == 0:
		return NoHint
	case slices.ContainsFunc(hints, namesThisNode):
		return HintHere
	}
	return HintElsewhere
}

// preference ranks copies of one endpoint found in several slices: ready
// first, then not terminating, then serving.
func preference(e Endpoint) int {
	rank := 0
	if e.Ready {
		rank += 4
	}
	if !e.Terminating {
		rank += 2
	}
	if e.Serving {
		rank++
	}
	return rank
}

func findFamily(fams []*familyAddrs, fam corev1.IPFamily) *familyAddrs {
	for _, fa := range fams {
		if fa.family == fam {
			return fa
		}
	}
	return nil
}

func familyOf(ip netip.Addr) corev1.IPFamily {
	if ip.Is4() {
		return corev1.IPv4Protocol
	}
	return corev1.IPv6Protocol
}

// parseIP parses an IP address. Like kube-proxy it also accepts the IPv4
// forms with leading zeros that objects created by older API servers may
// hold, and reads IPv4-mapped IPv6 addresses as IPv4.
func parseIP(s string) (netip.Addr, bool) {
	if ip, err := netip.ParseAddr(s); err == nil {
		return ip.Unmap(), ip.Zone() == ""
	}
	ip, ok := netip.AddrFromSlice(netutils.ParseIPSloppy(s))
	return ip.Unmap(), ok
}

// parsePrefix parses a CIDR, masking any host bits, or a bare IP address
// as a single-address prefix. Surrounding spaces, which API validation
// lets through, are ignored.
func parsePrefix(s string) (netip.Prefix, bool) {
	s = strings.TrimSpace(s)
	if !strings.Contains(s, "/") {
		ip, ok := parseIP(s)
		return netip.PrefixFrom(ip, ip.BitLen()), ok
	}
	if p, err := netip.ParsePrefix(s); err == nil {
		return UnmapPrefix(p)
	}
	_, n, err := netutils.ParseCIDRSloppy(s)
	if err != nil {
		return netip.Prefix{}, false
	}
	ip, _ := netip.AddrFromSlice(n.IP)
	ones, _ := n.Mask.Size()
	return UnmapPrefix(netip.PrefixFrom(ip, ones))
}

// UnmapPrefix returns p masked, with an IPv4-mapped IPv6 network
// (::ffff:10.0.0.0/104) turned into the IPv4 network it stands for
// (10.0.0.0/8), as parseIP reads mapped addresses. It says false for an
// invalid p and for a mapped network reaching outside ::ffff:0:0/96,
// which is no IPv4 network and would be a prefix longer than its
// addresses once unmapped.
func UnmapPrefix(p netip.Prefix) (netip.Prefix, bool) {
	if !p.IsValid() {
		return netip.Prefix{}, false
	}
	if !p.Addr().Is4In6() {
		return p.Masked(), true
	}
	if p.Bits() < 96 {
		return netip.Prefix{}, false
	}
	return netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96).Masked(), true
}

func validProtocol(p corev1.Protocol) bool {
	return p == corev1.ProtocolTCP || p == corev1.ProtocolUDP || p == corev1.ProtocolSCTP
}

func validPort(p int32) bool { return p > 0 && p <= 65535 }

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
