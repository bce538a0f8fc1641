package ipvs

import (
	"cmp"
	"fmt"
	"math"
	"net/netip"
	"slices"
	"strconv"

	"github.com/proxyshift/proxyshift/nodeagent/dataplane"
	"github.com/proxyshift/proxyshift/nodeagent/dataplane/internal/nft"
	"github.com/proxyshift/proxyshift/nodeagent/model"
)

// vsKey identifies a virtual service: address, protocol, port.
type vsKey struct {
	addr  netip.Addr
	proto uint8
	port  uint16
}

// String renders the key as protocol/address:port.
func (k vsKey) String() string {
	return nft.ProtoName(k.proto) + "/" + netip.AddrPortFrom(k.addr, k.port).String()
}

func compareKeys(a, b vsKey) int {
	return cmp.Or(a.addr.Compare(b.addr), cmp.Compare(a.proto, b.proto), cmp.Compare(a.port, b.port))
}

// virtualService is a virtual service as the backend programs it, or as
// the kernel reports one of ours.
type virtualService struct {
	key       vsKey
	scheduler string
	// timeout is the persistence timeout in seconds (ClientIP session
	// affinity); 0 means no persistence.
	timeout uint32
	// dests are the real servers with their weights. Weight 0 drains a
	// terminating endpoint: IPVS sends it no new connection, and its
	// established ones carry on.
	dests map[netip.AddrPort]int
}

// sameAttrs says whether two virtual services differ in nothing but
// their real servers.
func (vs *virtualService) sameAttrs(o *virtualService) bool {
	return vs.scheduler == o.scheduler && vs.timeout == o.timeout
}

// element is one element of a set or map of the helper table.
type element struct {
	set    string
	key    []byte
	keyEnd []byte
	// verdict is set for the elements of verdict maps.
	verdict *nft.Verdict
	comment string
	// owner is the virtual service the element serves; the zero key for
	// elements shared by several (service addresses, hairpin pairs).
	owner vsKey
	// ident is what id returns.
	ident string
}

// id identifies the element among all elements of its family's table,
// as nft lists it ("set: key : verdict comment ..."): two elements with
// the same id are the same kernel object.
func (e element) id() string { return e.ident }

// identify sets e's id from its set, its text as nft lists it (key and
// verdict) and its comment.
func (e element) identify(text string) element {
	e.ident = e.set + ": " + text
	if e.comment != "" {
		e.ident += " comment " + strconv.Quote(e.comment)
	}
	return e
}

// portObjects is what one service port renders to in one family.
type portObjects struct {
	// services are its virtual services, sorted by key.
	services []*virtualService
	// elems are its elements of the helper table, sorted by id.
	elems []element
	// addrs are the service addresses it binds to the dummy interface.
	addrs []netip.Addr
}

// renderConfig is what rendering one family depends on besides the model.
type renderConfig struct {
	f      *family
	policy dataplane.NodePolicy
	// nodePortIPs are the addresses node ports get virtual services on:
	// policy.NodePortIPs, or the node's local addresses of the family
	// when NodePorts answer on all of them.
	nodePortIPs []netip.Addr
	scheduler   string
	// exclude are the CIDRs whose virtual services are never deleted
	// (WithExcludeCIDRs); the plans leave them out of their deletions.
	exclude []netip.Prefix
}

// renderPort describes the objects of one service port: a virtual
// service per destination (cluster IP, each external and load-balancer
// IP, the node port on each node-port address), the service addresses to
// bind, and the helper-table elements that do what IPVS cannot. It is
// pure, and renders everything the port wants; claim decides which keys
// it gets when ports collide.
func renderPort(rc *renderConfig, sp *model.ServicePort) *portObjects {
	f := rc.f
	p := policy{rc.policy.PortPolicy(sp)}
	proto := nft.ProtoNumber(sp.Protocol)
	// Each virtual service has its record, up to three verdicts and a
	// hairpin pair per endpoint; addresses have their service-ips element.
	services := 1 + len(p.ExternalAddrs) + len(rc.nodePortIPs)
	objs := &portObjects{elems: make([]element, 0, services*(4+len(sp.Endpoints))+len(p.ExternalAddrs)+1)}
	comment := sp.Name.String()
	key := func(addr netip.Addr, port int32) vsKey { return vsKey{addr: addr, proto: proto, port: uint16(port)} }
	timeout := uint32(0)
	if sp.AffinityTimeout > 0 {
		timeout = uint32(min(math.Ceil(sp.AffinityTimeout.Seconds()), math.MaxUint32))
	}
	seen := map[vsKey]bool{}
	// addService adds the virtual service k with the active endpoints, and
	// reports false if the port already has it (an external IP that is
	// also its cluster IP, say): the first destination keeps it.
	addService := func(k vsKey, active []model.Endpoint, localOnly bool) bool {
		if seen[k] {
			return false
		}
		seen[k] = true
		vs := &virtualService{key: k, scheduler: rc.scheduler, timeout: timeout, dests: map[netip.AddrPort]int{}}
		for _, e := range active {
			vs.dests[endpointAddr(e)] = 1
		}
		// Terminating endpoints the policy does not use any more keep
		// their established connections, with no new ones.
		for _, e := range sp.Endpoints {
			if _, used := vs.dests[endpointAddr(e)]; !used && e.Terminating && (!localOnly || e.IsLocal) {
				vs.dests[endpointAddr(e)] = 0
			}
		}
		objs.services = append(objs.services, vs)
		objs.elems = append(objs.elems, keyElement(f, setVirtualServices, k, nil, comment))
		for d := range vs.dests {
			objs.elems = append(objs.elems, hairpinElement(f, d.Addr()))
		}
		return true
	}
	verdictFor := func(m string, k vsKey, v *nft.Verdict) {
		objs.elems = append(objs.elems, keyElement(f, m, k, v, ""))
	}

	if p.ClusterIP.IsValid() {
		k := key(p.ClusterIP, sp.Port)
		objs.addrs = append(objs.addrs, p.ClusterIP)
		// Internal drop happens under internalTrafficPolicy Local only.
		addService(k, p.endpointsOf(p.Internal), p.Internal == dataplane.TargetLocal || p.Internal == dataplane.TargetDrop)
		switch p.Internal {
		case dataplane.TargetReject:
			verdictFor(mapNoEndpoint, k, gotoReject)
		case dataplane.TargetDrop:
			verdictFor(mapNoEndpoint, k, verdictDrop)
		}
		switch p.InternalMasquerade {
		case dataplane.MasqueradeAll:
			verdictFor(mapFromPods, k, jumpMarkMasq)
			fallthrough
		case dataplane.MasqueradeOutsideClusterCIDRs:
			verdictFor(mapFromNode, k, jumpMarkMasq)
			verdictFor(mapFromOthers, k, jumpMarkMasq)
		}
	}

	var external []vsKey
	for _, a := range p.ExternalAddrs {
		external = append(external, key(a, sp.Port))
		objs.addrs = append(objs.addrs, a)
	}
	if p.NodePort != 0 {
		for _, ip := range rc.nodePortIPs {
			external = append(external, key(ip, p.NodePort))
		}
	}
	served := p.servedExternally()
	for _, k := range external {
		if !addService(k, p.endpointsOf(served), served == dataplane.TargetLocal) {
			continue
		}
		if p.ExternalReject {
			verdictFor(mapNoEndpoint, k, gotoReject)
			continue
		}
		for m, rule := range p.externalBySource() {
			switch {
			case rule.To == dataplane.TargetDrop:
				verdictFor(m, k, verdictDrop)
			case rule.Masquerade:
				verdictFor(m, k, jumpMarkMasq)
			}
		}
	}

	if fw := p.Firewall; fw != nil {
		for _, ip := range fw.IPs {
			k := key(ip, sp.Port)
			objs.elems = append(objs.elems, keyElement(f, setFirewall, k, nil, ""))
			allowed := slices.Clone(fw.SourceRanges)
			if fw.AllowIPs {
				for _, self := range fw.IPs {
					allowed = append(allowed, netip.PrefixFrom(self, self.BitLen()))
				}
			}
			for _, r := range allowed {
				objs.elems = append(objs.elems, firewallElement(f, k, r))
			}
		}
	}

	for _, a := range objs.addrs {
		objs.elems = append(objs.elems, addrElement(f, setServiceIPs, a))
	}
	slices.SortFunc(objs.services, func(a, b *virtualService) int { return compareKeys(a.key, b.key) })
	objs.elems = sortedUnique(objs.elems)
	slices.SortFunc(objs.addrs, netip.Addr.Compare)
	objs.addrs = slices.Compact(objs.addrs)
	return objs
}

// policy wraps dataplane.PortPolicy with the questions only IPVS asks.
type policy struct{ dataplane.PortPolicy }

// endpointsOf returns the endpoints target t chooses among: none for
// drop, reject or no target at all.
func (p *policy) endpointsOf(t dataplane.Target) []model.Endpoint {
	switch t {
	case dataplane.TargetCluster:
		return p.Cluster
	case dataplane.TargetLocal:
		return p.Local
	}
	return nil
}

// servedExternally is the target whose endpoints become the real servers
// of the external virtual services. IPVS chooses a real server by
// destination only, so one set serves every source: that of the rule
// for any source when it serves, else the first rule that does (under
// externalTrafficPolicy Local without a local endpoint, the one for
// pods and the node, while everyone else is dropped by the helper
// table). Zero when nothing serves.
func (p *policy) servedExternally() dataplane.Target {
	var first dataplane.Target
	for _, r := range p.External {
		serves := r.To == dataplane.TargetCluster || r.To == dataplane.TargetLocal
		if serves && r.From == dataplane.SourceAny {
			return r.To
		}
		if serves && first == 0 {
			first = r.To
		}
	}
	return first
}

// externalBySource returns, per source-class verdict map of the helper
// table, the rule of p.External that applies to packets from that class:
// the first whose source matches, as PortPolicy defines it. A class no
// rule matches is left out.
func (p *policy) externalBySource() map[string]dataplane.ExternalRule {
	out := map[string]dataplane.ExternalRule{}
	for m, class := range map[string]dataplane.Source{
		mapFromPods: dataplane.SourceClusterCIDRs, mapFromNode: dataplane.SourceNode, mapFromOthers: dataplane.SourceAny,
	} {
		for _, r := range p.External {
			if r.From == class || r.From == dataplane.SourceAny {
				out[m] = r
				break
			}
		}
	}
	return out
}

// The verdicts of the helper table's maps.
var (
	gotoReject   = nft.GotoChain(chainReject)
	jumpMarkMasq = nft.JumpTo(chainMarkMasq)
	verdictDrop  = nft.Drop
)

// keyBytes is a virtual service's key as the helper table's
// "address . inet_proto . inet_service" keys hold it: each field padded
// to a 32-bit register.
func keyBytes(f *family, k vsKey) []byte {
	b := append(f.Bytes(k.addr), k.proto, 0, 0, 0)
	return append(b, byte(k.port>>8), byte(k.port), 0, 0)
}

func keyText(k vsKey) string {
	return fmt.Sprintf("%s . %s . %d", k.addr, nft.ProtoName(k.proto), k.port)
}

// keyElement is the element of virtual service k in set or map m.
func keyElement(f *family, m string, k vsKey, v *nft.Verdict, comment string) element {
	text := keyText(k)
	if v != nil {
		text += " : " + v.String()
	}
	return element{set: m, key: keyBytes(f, k), verdict: v, comment: comment, owner: k}.identify(text)
}

// firewallElement allows sources in r to reach load-balancer virtual
// service k: a range of the concatenation "address . protocol . port .
// source", exact in its first three fields.
func firewallElement(f *family, k vsKey, r netip.Prefix) element {
	r = r.Masked()
	return element{
		set:    setFirewallAllowed,
		key:    append(keyBytes(f, k), f.Bytes(r.Addr())...),
		keyEnd: append(keyBytes(f, k), f.Bytes(nft.LastAddr(r))...),
		owner:  k,
	}.identify(keyText(k) + " . " + r.String())
}

// addrElement is address a in the address set m.
func addrElement(f *family, m string, a netip.Addr) element {
	return element{set: m, key: f.Bytes(a)}.identify(a.String())
}

// hairpinElement matches packets from endpoint address a to itself.
func hairpinElement(f *family, a netip.Addr) element {
	text := a.String()
	return element{set: setHairpin, key: append(f.Bytes(a), f.Bytes(a)...)}.identify(text + " . " + text)
}

// sortedUnique sorts elements by id and drops repeated ones.
func sortedUnique(elems []element) []element {
	slices.SortFunc(elems, func(a, b element) int { return cmp.Compare(a.id(), b.id()) })
	return slices.CompactFunc(elems, func(a, b element) bool { return a.id() == b.id() })
}

func endpointAddr(e model.Endpoint) netip.AddrPort {
	return netip.AddrPortFrom(e.IP.Unmap(), uint16(e.Port))
}
