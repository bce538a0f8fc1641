package model

// Address claims: which Service may take traffic sent to an address.
//
// A Service names addresses of two kinds. Its cluster IPs are allocated by
// the API server, one Service each. Its external addresses are written by
// whoever may write the Service: spec.externalIPs by anyone who may edit
// Services in its namespace, status.loadBalancer.ingress by the load
// balancer's controller. Nothing in the API stops a Service from naming, as
// an external address, another Service's cluster IP (a namespace admin's
// Service with externalIPs set to the cluster DNS address would take DNS
// on every node) or the node's own address (port 22 or 10250 of the node
// would go to the Service's pods). So the model claims addresses in a
// fixed order before any dataplane sees them:
//
//  1. cluster IPs belong to their Service, always;
//  2. the node's own addresses belong to the node;
//  3. an external address is taken per protocol and port: a load-balancer
//     IP before an externalIP (the first is written by a controller, the
//     second by any namespace editor), then the older Service, then
//     namespace/name order.
//
// An external address a Service may not take is left out of its
// ServicePort, so no dataplane programs it, and reported as a Refusal.

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// Fields of a Service that external addresses come from, as a Refusal
// names them.
const (
	FieldExternalIPs     = "spec.externalIPs"
	FieldLoadBalancerIPs = "status.loadBalancer.ingress"
)

// Refusal is an external address of a Service that the node does not
// route to it, and why. Its text is one log line.
type Refusal struct {
	// Service is the Service that named the address.
	Service ServiceName
	// Field is FieldExternalIPs or FieldLoadBalancerIPs.
	Field string
	// Addr is the refused address.
	Addr netip.Addr
	// Protocol and Port are set when the address is refused on this port
	// only (another Service took it there); zero when it is refused on
	// every port.
	Protocol corev1.Protocol
	Port     int32
	// Reason says who owns the address instead.
	Reason string
}

// Error renders the refusal as "service ns/name: spec.externalIPs
// 198.19.0.10 not routed to it: reason".
func (r *Refusal) Error() string {
	where := r.Addr.String()
	if r.Port != 0 {
		where = fmt.Sprintf("%s port %d/%s", where, r.Port, r.Protocol)
	}
	return fmt.Sprintf("service %s: %s %s not routed to it: %s", r.Service, r.Field, where, r.Reason)
}

// addrKind ranks the kinds of address a Service names, most trusted
// first.
type addrKind int

const (
	kindCluster addrKind = iota
	kindLoadBalancer
	kindExternal
)

// claimKey is one address a service port names, with its kind.
type claimKey struct {
	addr     netip.Addr
	kind     addrKind
	protocol corev1.Protocol
	port     int32
}

// claimKeys lists the addresses ports name, sorted, to tell whether a
// rebuild changed any claim.
func claimKeys(ports []*ServicePort) []claimKey {
	var out []claimKey
	for _, sp := range ports {
		add := func(kind addrKind, addrs ...netip.Addr) {
			for _, a := range addrs {
				out = append(out, claimKey{addr: a, kind: kind, protocol: sp.Protocol, port: sp.Port})
			}
		}
		add(kindCluster, sp.ClusterIP)
		add(kindLoadBalancer, sp.LoadBalancerIPs...)
		add(kindExternal, sp.ExternalIPs...)
	}
	slices.SortFunc(out, func(x, y claimKey) int {
		return cmp.Or(x.addr.Compare(y.addr), cmp.Compare(x.kind, y.kind), cmp.Compare(x.protocol, y.protocol), cmp.Compare(x.port, y.port))
	})
	return slices.Compact(out)
}

// claimant is what decides between two Services naming one external
// address on one port.
type claimant struct {
	kind    addrKind
	created time.Time
	name    ServiceName
}

// before says whether c takes the address ahead of o.
func (c claimant) before(o claimant) bool {
	if c.kind != o.kind {
		return c.kind < o.kind
	}
	if !c.created.Equal(o.created) {
		return c.created.Before(o.created)
	}
	return compareNames(c.name, o.name) < 0
}

// claims indexes the addresses every Service names. It is the Tracker's
// and shares its lock.
type claims struct {
	// clusterIPs maps a cluster IP to the Services that have it (one, but
	// the index does not rely on the API server for that). Lists, not
	// sets: nearly every address has one Service, and a map per address
	// took 4 MB at 10 000 Services.
	clusterIPs map[netip.Addr][]ServiceName
	// external maps an external address to the Services naming it.
	external map[netip.Addr][]ServiceName
	// node holds the node's own addresses.
	node map[netip.Addr]bool
	// nodeName names the node in refusals.
	nodeName string
}

func newClaims(nodeName string) *claims {
	return &claims{
		clusterIPs: map[netip.Addr][]ServiceName{},
		external:   map[netip.Addr][]ServiceName{},
		node:       map[netip.Addr]bool{},
		nodeName:   nodeName,
	}
}

// index replaces the addresses svc names (old) with new ones, and returns
// the Services whose claims may have changed: svc, and, when its addresses
// changed, every Service naming one of them as an external address.
func (c *claims) index(svc ServiceName, old, new []claimKey) []ServiceName {
	affected := []ServiceName{svc}
	if slices.Equal(old, new) {
		return affected
	}
	for _, k := range old {
		m := c.byKind(k.kind)
		if m[k.addr] = slices.DeleteFunc(m[k.addr], func(s ServiceName) bool { return s == svc }); len(m[k.addr]) == 0 {
			delete(m, k.addr)
		}
	}
	for _, k := range new {
		if m := c.byKind(k.kind); !slices.Contains(m[k.addr], svc) {
			m[k.addr] = append(m[k.addr], svc)
		}
	}
	for _, k := range append(slices.Clone(old), new...) {
		for _, other := range c.external[k.addr] {
			if !slices.Contains(affected, other) {
				affected = append(affected, other)
			}
		}
	}
	return affected
}

func (c *claims) byKind(k addrKind) map[netip.Addr][]ServiceName {
	if k == kindCluster {
		return c.clusterIPs
	}
	return c.external
}

// setNode replaces the node's addresses and returns the Services naming
// an address that was added or removed.
func (c *claims) setNode(addrs []netip.Addr) []ServiceName {
	next := map[netip.Addr]bool{}
	for _, a := range addrs {
		next[a.Unmap()] = true
	}
	var changed []netip.Addr
	for a := range next {
		if !c.node[a] {
			changed = append(changed, a)
		}
	}
	for a := range c.node {
		if !next[a] {
			changed = append(changed, a)
		}
	}
	c.node = next
	var affected []ServiceName
	for _, a := range changed {
		for _, svc := range c.external[a] {
			if !slices.Contains(affected, svc) {
				affected = append(affected, svc)
			}
		}
	}
	return affected
}

// claimSource gives the claims what they need to know of other Services:
// their built ports and when they were created.
type claimSource interface {
	builtPorts(ServiceName) []*ServicePort
	created(ServiceName) time.Time
}

// resolve returns ports with every external address svc may not take left
// out, and the refusals. A port that keeps all its addresses is returned
// as it is.
func (c *claims) resolve(svc ServiceName, ports []*ServicePort, src claimSource) ([]*ServicePort, []*Refusal) {
	var refusals []*Refusal
	out := make([]*ServicePort, 0, len(ports))
	for _, sp := range ports {
		lb, r1 := c.keep(svc, sp, kindLoadBalancer, sp.LoadBalancerIPs, src)
		ext, r2 := c.keep(svc, sp, kindExternal, sp.ExternalIPs, src)
		if len(r1)+len(r2) == 0 {
			out = append(out, sp)
			continue
		}
		for _, r := range append(r1, r2...) {
			if !slices.ContainsFunc(refusals, func(o *Refusal) bool { return *o == *r }) {
				refusals = append(refusals, r)
			}
		}
		cp := *sp
		cp.LoadBalancerIPs, cp.ExternalIPs = lb, ext
		if len(cp.LoadBalancerIPs) == 0 {
			cp.LoadBalancerSourceRanges = nil // they guard load-balancer IPs only
		}
		out = append(out, &cp)
	}
	return out, refusals
}

// keep returns the addresses of one kind that sp may take, and a refusal
// for each other one.
func (c *claims) keep(svc ServiceName, sp *ServicePort, kind addrKind, addrs []netip.Addr, src claimSource) ([]netip.Addr, []*Refusal) {
	field := FieldExternalIPs
	if kind == kindLoadBalancer {
		field = FieldLoadBalancerIPs
	}
	var kept []netip.Addr
	var refused []*Refusal
	for _, a := range addrs {
		r := c.refuse(svc, sp, kind, a, src)
		if r == nil {
			kept = append(kept, a)
			continue
		}
		r.Service, r.Field, r.Addr = svc, field, a
		refused = append(refused, r)
	}
	return kept, refused
}

// refuse returns why sp of svc may not take addr, or nil if it may. When
// several Services stand in the way, it names the first in claim order,
// so the message never depends on map order.
func (c *claims) refuse(svc ServiceName, sp *ServicePort, kind addrKind, addr netip.Addr, src claimSource) *Refusal {
	var owners []ServiceName
	for _, owner := range c.clusterIPs[addr] {
		if owner != svc {
			owners = append(owners, owner)
		}
	}
	if len(owners) > 0 {
		owner := slices.MinFunc(owners, compareNames)
		return &Refusal{Reason: "it is the cluster IP of Service " + owner.String()}
	}
	if c.node[addr] {
		return &Refusal{Reason: "it is an address of node " + c.nodeName}
	}
	me := claimant{kind: kind, created: src.created(svc), name: svc}
	var first *claimant
	for _, other := range c.external[addr] {
		if other == svc {
			continue
		}
		for _, op := range src.builtPorts(other) {
			if op.Protocol != sp.Protocol || op.Port != sp.Port {
				continue
			}
			for _, k := range []addrKind{kindLoadBalancer, kindExternal} {
				them := claimant{kind: k, created: src.created(other), name: other}
				if slices.Contains(addressesOf(op, k), addr) && them.before(me) && (first == nil || them.before(*first)) {
					first = &them
				}
			}
		}
	}
	if first == nil {
		return nil
	}
	return &Refusal{Protocol: sp.Protocol, Port: sp.Port,
		Reason: fmt.Sprintf("Service %s takes it on this port (%s)", first.name, precedence(*first, me))}
}

func compareNames(x, y ServiceName) int {
	return cmp.Or(cmp.Compare(x.Namespace, y.Namespace), cmp.Compare(x.Name, y.Name))
}

// precedence says why them goes before me.
func precedence(them, me claimant) string {
	switch {
	case them.kind != me.kind:
		return "a load-balancer IP goes before an externalIP"
	case !them.created.Equal(me.created):
		return "it is older"
	}
	return "same age; first by namespace/name"
}

func addressesOf(sp *ServicePort, k addrKind) []netip.Addr {
	if k == kindLoadBalancer {
		return sp.LoadBalancerIPs
	}
	return sp.ExternalIPs
}
