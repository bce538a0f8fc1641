package nftables

import (
	"cmp"
	"encoding/binary"
	"net/netip"
	"slices"
	"strconv"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"golang.org/x/sys/unix"

	"github.com/proxyshift/proxyshift/nodeagent/dataplane"
	"github.com/proxyshift/proxyshift/nodeagent/dataplane/internal/nft"
	"github.com/proxyshift/proxyshift/nodeagent/model"
)

// Base-chain priorities. They are chosen against kube-proxy's (filter
// chains at dstnat-10, nat chains at dstnat and srcnat) and iptables' nat
// table (dstnat, srcnat), so that on a node where either still runs,
// proxyshift sees each new connection first: see the README.
const (
	priorityFilter = nftables.ChainPriority(-120) // dstnat-20
	// priorityFilterPostDNAT is kube-proxy's own for the same check:
	// after every DNAT of the output hook, its and iptables' included.
	priorityFilterPostDNAT = nftables.ChainPriority(-90)  // dstnat+10
	priorityDNAT           = nftables.ChainPriority(-110) // dstnat-10
	prioritySNAT           = nftables.ChainPriority(90)   // srcnat-10
)

// newNodePolicy returns the node's policy for family f.
func newNodePolicy(f *family, cfg dataplane.NodeConfig) *dataplane.NodePolicy {
	np := dataplane.NewNodePolicy(cfg, f.Model)
	return &np
}

// render describes the whole table of family f for the model's ports of
// that family, as np (the node's policy for that family) decides them. It
// is pure: the same input always gives the same ruleset. Ports are
// numbered (portObjects.id) in name order.
// When two ports claim the same key in a shared map (two services with
// one external IP and port), the first by name keeps it; claims records
// who holds which key.
func render(f *family, ports map[model.ServicePortName]*model.ServicePort, np *dataplane.NodePolicy) (rs *ruleset, claims claimIndex) {
	return renderIDs(f, ports, np, nil)
}

// renderIDs is render with the ports' ids taken from ids where it has
// them (the others get ids above all of those): what a table synced
// incrementally since its last full sync must hold.
func renderIDs(f *family, ports map[model.ServicePortName]*model.ServicePort, np *dataplane.NodePolicy,
	ids map[model.ServicePortName]uint32) (rs *ruleset, claims claimIndex) {
	rs = &ruleset{f: f, ports: make(map[model.ServicePortName]*portObjects, len(ports)), counted: newCountedElems(), endpointMaps: refCounts{}, nextID: 1}
	for _, id := range ids {
		rs.nextID = max(rs.nextID, id+1)
	}
	rs.chains, rs.sets = renderFixed(f, np)
	claims = claimIndex{}
	for _, name := range model.SortedNames(ports) {
		id, ok := ids[name]
		if !ok {
			id = rs.nextID
			rs.nextID++
		}
		objs := renderPort(f, ports[name], np, id)
		if claims.claim(name, objs) {
			rs.contested = true
		}
		rs.ports[name] = objs
		rs.counted.add(objs, 1)
		rs.endpointMaps.addEndpointMap(objs, 1)
	}
	return rs, claims
}

// claimIndex records which port owns each key of the shared maps.
type claimIndex map[string]map[string]model.ServicePortName

// claim takes the keys of objs' shared elements for name, dropping from
// objs those another port holds, and duplicates. It says whether another
// port held one of them.
func (c claimIndex) claim(name model.ServicePortName, objs *portObjects) (contested bool) {
	for i := range objs.shared {
		sh := &objs.shared[i]
		m := sh.set
		if c[m] == nil {
			c[m] = map[string]model.ServicePortName{}
		}
		kept := sh.elems[:0]
		seen := map[string]bool{}
		for _, e := range sh.elems {
			key := e.keyText()
			if owner, ok := c[m][key]; seen[key] || ok && owner != name {
				contested = contested || !seen[key]
				continue
			}
			seen[key] = true
			c[m][key] = name
			kept = append(kept, e)
		}
		sh.elems = kept
	}
	return contested
}

// release gives up name's keys in objs.
func (c claimIndex) release(name model.ServicePortName, objs *portObjects) {
	for _, sh := range objs.shared {
		for _, e := range sh.elems {
			if key := e.keyText(); c[sh.set][key] == name {
				delete(c[sh.set], key)
			}
		}
	}
}

// renderFixed returns the chains and sets every table has.
func renderFixed(f *family, np *dataplane.NodePolicy) ([]*chain, []*set) {
	base := func(name string, typ nftables.ChainType, hookName string, num uint32, prio nftables.ChainPriority, rules ...*nft.Builder) *chain {
		return &chain{Name: name, Hook: &hook{Type: typ, Name: hookName, Num: nftables.ChainHook(num), Priority: prio}, Rules: built(rules)}
	}
	regular := func(name string, rules ...*nft.Builder) *chain {
		return &chain{Name: name, Rules: built(rules)}
	}
	r := func() *nft.Builder { return nft.NewRule(f) }

	chains := []*chain{
		// Before DNAT: the destination is still the service address.
		base(chainFilterPrerouting, nftables.ChainTypeFilter, "prerouting", unix.NF_INET_PRE_ROUTING, priorityFilter,
			r().CtStateNew().Jump(chainFirewallCheck)),
		base(chainFilterInput, nftables.ChainTypeFilter, "input", unix.NF_INET_LOCAL_IN, priorityFilter,
			r().CtStateNew().Jump(chainEndpointCheck)),
		base(chainFilterForward, nftables.ChainTypeFilter, "forward", unix.NF_INET_FORWARD, priorityFilter,
			r().CtStateNew().Jump(chainEndpointCheck),
			r().CtStateNew().Jump(chainClusterIPCheck)),
		base(chainFilterOutput, nftables.ChainTypeFilter, "output", unix.NF_INET_LOCAL_OUT, priorityFilter,
			r().CtStateNew().Jump(chainFirewallCheck),
			r().CtStateNew().Jump(chainEndpointCheck)),
		// After DNAT: what still goes to a cluster IP matched none of its
		// ports.
		base(chainFilterOutputPost, nftables.ChainTypeFilter, "output", unix.NF_INET_LOCAL_OUT, priorityFilterPostDNAT,
			r().CtStateNew().Jump(chainClusterIPCheck)),
		base(chainNATPrerouting, nftables.ChainTypeNAT, "prerouting", unix.NF_INET_PRE_ROUTING, priorityDNAT,
			r().Jump(chainServices)),
		base(chainNATOutput, nftables.ChainTypeNAT, "output", unix.NF_INET_LOCAL_OUT, priorityDNAT,
			r().Jump(chainServices)),
		base(chainNATPostrouting, nftables.ChainTypeNAT, "postrouting", unix.NF_INET_POST_ROUTING, prioritySNAT,
			r().Jump(chainMasquerading)),
	}

	// Cluster-IP traffic is marked for masquerading here, by one rule for
	// every port (the ports put their cluster IP in cluster-ips), before
	// the dispatch sends it to the port's chain. Traffic to a port the
	// cluster IP does not have is marked too, and rejected after DNAT
	// (cluster-ips-check): it never leaves the node.
	var services []*nft.Builder
	switch {
	case np.MasqueradeAll:
		services = append(services, r().AddrInSet("daddr", false, setClusterIPs).Jump(chainMarkMasq))
	case len(np.ClusterCIDRs) > 0:
		services = append(services, r().AddrInSet("daddr", false, setClusterIPs).AddrInSet("saddr", true, setClusterCIDRs).Jump(chainMarkMasq))
	}
	services = append(services, r().VmapService(mapServiceIPs))
	endpointCheck := []*nft.Builder{r().VmapService(mapNoEndpointServices)}
	if nodePort := nodePortMatch(f, np); nodePort != nil {
		services = append(services, nodePort().VmapProtoPort(mapServiceNodePorts))
		endpointCheck = append(endpointCheck, nodePort().VmapProtoPort(mapNoEndpointNodePorts))
	}
	chains = append(chains,
		regular(chainServices, services...),
		regular(chainEndpointCheck, endpointCheck...),
		regular(chainFirewallCheck, r().VmapService(mapFirewallIPs)),
		regular(chainClusterIPCheck, r().AddrInSet("daddr", false, setClusterIPs).Goto(chainReject)),
		// TCP gets a reset rather than ICMP: ICMPv6 port unreachable for a
		// forwarded or local connection did not reliably reach the
		// client's socket in our tests, a reset does in both families.
		regular(chainReject, r().RejectTCP(), r().Reject()),
		regular(chainMarkMasq, r().MarkSet(np.MasqueradeMark)),
		regular(chainMasquerading,
			// Hairpin (an endpoint reached itself through a service) is
			// marked here, before the mark is tested, so that every
			// masquerade goes through the one rule below.
			r().CtStatusDNAT().AddrPairInSet(setHairpin).MarkSet(np.MasqueradeMark),
			r().MarkUnset(np.MasqueradeMark).Return(),
			r().MarkClear(np.MasqueradeMark),
			r().Masquerade()),
	)
	slices.SortFunc(chains[len(baseChainNames):], func(a, b *chain) int { return cmp.Compare(a.Name, b.Name) })

	addrProtoPort := nftables.MustConcatSetType(f.AddrType, nftables.TypeInetProto, nftables.TypeInetService)
	protoPort := nftables.MustConcatSetType(nftables.TypeInetProto, nftables.TypeInetService)
	addrText := f.AddrType.Name + " . inet_proto . inet_service"
	vmap := func(name string, t nftables.SetDatatype, text string) *set {
		return &set{name: name, keyType: t, keyText: text, verdictMap: true}
	}
	sets := []*set{
		vmap(mapFirewallIPs, addrProtoPort, addrText),
		vmap(mapNoEndpointNodePorts, protoPort, "inet_proto . inet_service"),
		vmap(mapNoEndpointServices, addrProtoPort, addrText),
		vmap(mapServiceIPs, addrProtoPort, addrText),
		vmap(mapServiceNodePorts, protoPort, "inet_proto . inet_service"),
		// Their elements belong to the service ports, counted in
		// ruleset.counted.
		{name: setHairpin, keyType: nftables.MustConcatSetType(f.AddrType, f.AddrType), keyText: f.AddrType.Name + " . " + f.AddrType.Name},
		{name: setClusterIPs, keyType: f.AddrType, keyText: f.AddrType.Name},
	}
	if len(np.ClusterCIDRs) > 0 {
		s := &set{name: setClusterCIDRs, keyType: f.AddrType, keyText: f.AddrType.Name, interval: true}
		for _, p := range np.ClusterCIDRs {
			s.elems = append(s.elems, prefixElement(f, p))
		}
		sets = append(sets, s)
	}
	if !np.NodePortsAnyLocal && len(np.NodePortIPs) > 0 {
		s := &set{name: setNodePortIPs, keyType: f.AddrType, keyText: f.AddrType.Name}
		for _, ip := range np.NodePortIPs {
			s.elems = append(s.elems, newElement(f.Bytes(ip), nil, nil, ip.String(), ""))
		}
		sets = append(sets, s)
	}
	slices.SortFunc(sets, func(a, b *set) int { return cmp.Compare(a.name, b.name) })
	return chains, sets
}

// baseChainNames lists the base chains in the order renderFixed returns
// them.
var baseChainNames = []string{chainFilterPrerouting, chainFilterInput, chainFilterForward, chainFilterOutput,
	chainFilterOutputPost, chainNATPrerouting, chainNATOutput, chainNATPostrouting}

// nodePortMatch returns a function starting a rule that matches packets
// to a NodePort address, or nil if the family has no NodePort addresses.
func nodePortMatch(f *family, np *dataplane.NodePolicy) func() *nft.Builder {
	switch {
	case np.NodePortsAnyLocal:
		return func() *nft.Builder { return nft.NewRule(f).FibLocal("daddr").AddrIn("daddr", true, np.Loopback) }
	case len(np.NodePortIPs) > 0:
		return func() *nft.Builder { return nft.NewRule(f).AddrInSet("daddr", false, setNodePortIPs) }
	default:
		return nil
	}
}

func built(rbs []*nft.Builder) []rule {
	rules := make([]rule, len(rbs))
	for i, rb := range rbs {
		rules[i] = rb.Rule()
	}
	return rules
}

// numgenRange is the modulus of the random number the endpoint-choosing
// rule draws: fixed, so that the rule never changes when endpoints come
// and go; the service-endpoints map splits [0, numgenRange) among the
// endpoints.
const numgenRange = 65536

// choiceKey is the first key of an endpoint choice in its
// service-endpoints map: the rule adds it to the random number as its
// numgen offset, so that a choice's keys are [choiceKey, choiceKey +
// numgenRange). A map holds the choices of endpointMapPorts ports, two
// each (cluster and local), numbered within the map: the keys stay below
// 2*endpointMapPorts*numgenRange (2 097 152), short to list and to store.
func choiceKey(choice uint32) uint32 {
	return choice % (2 * endpointMapPorts) * numgenRange
}

// renderPort describes the objects of one service port, as np's policy
// for it decides; id numbers the port (portObjects.id).
func renderPort(f *family, sp *model.ServicePort, np *dataplane.NodePolicy, id uint32) *portObjects {
	pol := np.PortPolicy(sp)
	n := namesFor(sp.Name)
	objs := &portObjects{id: id}
	proto := nft.ProtoNumber(sp.Protocol)
	protoText := nft.ProtoName(proto)
	r := func() *nft.Builder { return nft.NewRule(f) }
	share := func(m string, key []byte, text string, v *nft.Verdict) {
		e := newElement(key, nil, nil, text, "")
		e.verdict = v
		if v != nil && portHash(v.Chain) == "" {
			e.comment = n.comment
		}
		objs.shared.add(m, e)
	}
	addrKey := func(addr netip.Addr) ([]byte, string) {
		return addrProtoPortKey(f, addr, proto, sp.Port), addr.String() + " . " + protoText + " . " + itoa(sp.Port)
	}
	targetChain := map[dataplane.Target]string{dataplane.TargetCluster: n.service, dataplane.TargetLocal: n.local}

	// Cluster IP traffic goes to the chain of its target; drops and
	// rejects are decided by the filter chains' endpoints-check. The
	// cluster IP itself is in cluster-ips, whatever the target: traffic to
	// it that no port takes is rejected.
	if pol.ClusterIP.IsValid() {
		objs.counted.add(setClusterIPs, newElement(f.Bytes(pol.ClusterIP), nil, nil, pol.ClusterIP.String(), ""))
		key, text := addrKey(pol.ClusterIP)
		switch pol.Internal {
		case dataplane.TargetCluster, dataplane.TargetLocal:
			share(mapServiceIPs, key, text, nft.GotoChain(targetChain[pol.Internal]))
		case dataplane.TargetDrop:
			share(mapNoEndpointServices, key, text, nft.Drop)
		case dataplane.TargetReject:
			share(mapNoEndpointServices, key, text, nft.GotoChain(chainReject))
		}
	}

	// External destinations go to the external chain, or are rejected
	// when there is no endpoint at all.
	external := nft.GotoChain(n.external)
	externalMap, nodePortMap := mapServiceIPs, mapServiceNodePorts
	if pol.ExternalReject {
		external = nft.GotoChain(chainReject)
		externalMap, nodePortMap = mapNoEndpointServices, mapNoEndpointNodePorts
	}
	for _, addr := range pol.ExternalAddrs {
		key, text := addrKey(addr)
		share(externalMap, key, text, external)
	}
	if pol.NodePort != 0 {
		share(nodePortMap, protoPortKey(proto, pol.NodePort), protoText+" . "+itoa(pol.NodePort), external)
	}

	// loadBalancerSourceRanges: a firewall chain, checked before DNAT,
	// that lets the allowed sources through and drops the rest.
	if fw := pol.Firewall; fw != nil {
		c := &chain{Name: n.firewall}
		for _, p := range fw.SourceRanges {
			c.Rules = append(c.Rules, r().AddrIn("saddr", false, p).Return().Rule())
		}
		if fw.AllowIPs {
			for _, ip := range fw.IPs {
				c.Rules = append(c.Rules, r().AddrIs("saddr", false, ip).Return().Rule())
			}
		}
		c.Rules = append(c.Rules, r().Drop().Rule())
		objs.chains = append(objs.chains, c)
		for _, ip := range fw.IPs {
			key, text := addrKey(ip)
			share(mapFirewallIPs, key, text, nft.GotoChain(n.firewall))
		}
	}

	if len(pol.External) > 0 {
		objs.chains = append(objs.chains, externalChain(f, pol.External, n.external, targetChain))
	}

	// The endpoint-choosing chains, with their maps, and the endpoints.
	if pol.Cluster != nil {
		objs.addPolicyChain(f, sp, n, n.service, n.serviceMap, id<<1, pol.Cluster)
	}
	if pol.Local != nil {
		objs.addPolicyChain(f, sp, n, n.local, n.localMap, id<<1|1, pol.Local)
	}
	// Hairpin: an endpoint reaching its own service must see the reply
	// come from the node, not from itself. The masquerading chain
	// matches the pairs of the hairpin set, whatever port put them there.
	// Only this node's endpoints can hairpin through its rules (a pod
	// elsewhere reaches its service through its own node), so only they
	// have pairs, as in kube-proxy.
	seen := map[netip.Addr]bool{}
	for _, ep := range pol.Endpoints() {
		objs.endpoints++
		if ep.IsLocal && !seen[ep.IP] {
			seen[ep.IP] = true
			objs.counted.add(setHairpin, hairpinElement(f, ep.IP))
		}
		if sp.AffinityTimeout == 0 {
			continue
		}
		// ClientIP affinity: one chain per endpoint, which records the
		// client in the endpoint's affinity set and DNATs.
		chainName, affinity := endpointNames(n.base, ep)
		objs.chains = append(objs.chains, &chain{Name: chainName, Rules: []rule{
			r().UpdateSaddr(affinity).Rule(),
			r().DNAT(sp.Protocol, ep.IP, ep.Port).Rule(),
		}})
		objs.sets = append(objs.sets, &set{name: affinity, keyType: f.AddrType, keyText: f.AddrType.Name, timeout: sp.AffinityTimeout})
	}
	for _, sh := range objs.counted {
		slices.SortFunc(sh.elems, func(a, b element) int { return cmp.Compare(a.keyText(), b.keyText()) })
	}
	slices.SortFunc(objs.chains, func(a, b *chain) int { return cmp.Compare(a.Name, b.Name) })
	slices.SortFunc(objs.sets, func(a, b *set) int { return cmp.Compare(a.name, b.name) })
	return objs
}

// externalChain is where traffic to the node port, external IPs and
// load-balancer IPs goes before choosing an endpoint: the policy's
// external rules, in order, each a masquerade mark if it asks for one and
// a goto to its target's chain (or a drop).
func externalChain(f *family, rules []dataplane.ExternalRule, name string, targetChain map[dataplane.Target]string) *chain {
	c := &chain{Name: name}
	from := func(src dataplane.Source) *nft.Builder {
		r := nft.NewRule(f)
		switch src {
		case dataplane.SourceClusterCIDRs:
			r.AddrInSet("saddr", false, setClusterCIDRs)
		case dataplane.SourceNode:
			r.FibLocal("saddr")
		}
		return r
	}
	for _, rule := range rules {
		if rule.Masquerade {
			c.Rules = append(c.Rules, from(rule.From).Jump(chainMarkMasq).Rule())
		}
		if rule.To == dataplane.TargetDrop {
			c.Rules = append(c.Rules, from(rule.From).Drop().Rule())
		} else {
			c.Rules = append(c.Rules, from(rule.From).Goto(targetChain[rule.To]).Rule())
		}
	}
	return c
}

// addPolicyChain adds a chain choosing one of eps at random, and the map
// it chooses with. (Cluster-IP traffic is marked for masquerading before
// it gets here, in the services chain.)
//
// Without ClientIP affinity, the chain ends with one rule that never
// changes: DNAT to the address and port the port's service-endpoints map
// holds for choiceKey(choice) + n, n a random number in [0, numgenRange)
// and choice this chain's number (the port's id, and which of its two
// chains), the map splitting the range among the endpoints. An endpoint
// change rewrites the port's elements of the map only, which (unlike a
// new rule or a verdict-map element that jumps) does not make the kernel
// re-validate the table. A map serves endpointMapPorts ports, see there
// why.
//
// With affinity, the chain first sends clients found in an endpoint's
// affinity set to that endpoint's chain, then picks an endpoint chain
// through a numgen verdict map: the endpoint chain records the client.
func (objs *portObjects) addPolicyChain(f *family, sp *model.ServicePort, n servicePortNames, name, mapName string,
	choice uint32, eps []model.Endpoint) {
	r := func() *nft.Builder { return nft.NewRule(f) }
	c := &chain{Name: name}
	if sp.AffinityTimeout == 0 {
		if objs.endpointMap == nil {
			objs.endpointMap = &set{name: endpointMapName(objs.id), keyType: nftables.TypeInteger, keyText: "integer", interval: true, numgenKey: numgenRange,
				dataType: nftables.MustConcatSetType(f.AddrType, nftables.TypeInetService), dataText: f.AddrType.Name + " . inet_service"}
		}
		objs.endpointChoices = append(objs.endpointChoices, endpointChoice{f: f, choice: choice, eps: eps})
		c.Rules = append(c.Rules, r().DNATNumgenMap(sp.Protocol, numgenRange, choiceKey(choice), objs.endpointMap.name).Rule())
		objs.chains = append(objs.chains, c)
		return
	}
	m := &set{name: mapName, keyType: nftables.TypeInteger, keyText: "integer", verdictMap: true, numgenKey: numgenRange}
	for i, ep := range eps {
		epChain, affinity := endpointNames(n.base, ep)
		c.Rules = append(c.Rules, r().AddrInSet("saddr", false, affinity).Goto(epChain).Rule())
		e := newElement(binaryutil.NativeEndian.PutUint32(uint32(i)), nil, nil, itoa(int32(i)), "")
		e.verdict = nft.GotoChain(epChain)
		m.elems = append(m.elems, e)
	}
	c.Rules = append(c.Rules, r().NumgenVmap(len(eps), mapName).Rule())
	objs.chains = append(objs.chains, c)
	objs.sets = append(objs.sets, m)
}

// numgenRanges splits [0, numgenRange) into one nearly equal interval
// per endpoint (their sizes differ by at most one), each mapped to the
// endpoint's address . port, as elements "lo-hi" of the service-endpoints
// map, offset by the choice's first key (choiceKey). Endpoints beyond
// numgenRange get none.
//
// A full sync renders 100 000 of them at 10k services: each element's
// bytes (key, range end, data) are one allocation and its text another
// (newElement would make each twice).
func numgenRanges(f *family, choice uint32, eps []model.Endpoint) []element {
	n := min(len(eps), numgenRange)
	elems := make([]element, 0, n)
	first := choiceKey(choice)
	text := make([]byte, 0, 80)
	for i, ep := range eps[:n] {
		lo, end := first+uint32(i*numgenRange/n), first+uint32((i+1)*numgenRange/n)
		text = strconv.AppendUint(text[:0], uint64(lo), 10)
		if end-1 != lo {
			text = strconv.AppendUint(append(text, '-'), uint64(end-1), 10)
		}
		keyTextLen := len(text)
		text = ep.IP.AppendTo(append(text, " : "...))
		text = strconv.AppendInt(append(text, " . "...), int64(ep.Port), 10)
		// key, range end, then the data: address, port (two bytes, padded
		// to a register's four).
		b := make([]byte, 0, 8+f.AddrLen+4)
		b = binary.BigEndian.AppendUint32(b, lo)
		b = binary.BigEndian.AppendUint32(b, end-1)
		b = f.AppendBytes(b, ep.IP)
		b = binary.BigEndian.AppendUint16(b, uint16(ep.Port))
		b = append(b, 0, 0)
		elems = append(elems, element{raw: b, text: string(text), keyLen: 4, endLen: 4, keyTextLen: uint16(keyTextLen)})
	}
	return elems
}

// hairpinElement is the hairpin set's element for an endpoint address:
// the pair "address . address", a connection from the endpoint to itself.
func hairpinElement(f *family, ip netip.Addr) element {
	return newElement(append(f.Bytes(ip), f.Bytes(ip)...), nil, nil, ip.String()+" . "+ip.String(), "")
}
