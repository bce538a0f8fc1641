package nftables

import (
	"cmp"
	"net/netip"
	"slices"
	"strings"

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
	// priorityMark is the main table's nat chains': before every service
	// table's, since the kernel calls no nat chain after one that NATed
	// the connection.
	priorityMark = nftables.ChainPriority(-111) // dstnat-11
	prioritySNAT = nftables.ChainPriority(90)   // srcnat-10
)

// newNodePolicy returns the node's policy for family f.
func newNodePolicy(f *family, cfg dataplane.NodeConfig) *dataplane.NodePolicy {
	np := dataplane.NewNodePolicy(cfg, f.Model)
	return &np
}

// render describes the tables of family f for the model's ports of that
// family, as np (the node's policy for that family) decides them. It is
// pure: the same input always gives the same rulesets.
// When two ports claim the same key in a shared map (two services with
// one external IP and port), the first by name keeps it; claims records
// who holds which key.
func render(f *family, ports map[model.ServicePortName]*model.ServicePort, np *dataplane.NodePolicy) (ts tables, claims claimIndex) {
	ts = emptyTables(f, np)
	claims = claimIndex{}
	for _, name := range model.SortedNames(ports) {
		objs := renderPort(f, ports[name], np)
		if claims.claim(name, objs) {
			ts.main().contested = true
		}
		ts.add(name, objs)
	}
	return ts, claims
}

// emptyTables are family f's tables with their fixed objects only.
func emptyTables(f *family, np *dataplane.NodePolicy) tables {
	mainChains, mainSets, serviceChains, serviceSets := renderFixed(f, np)
	ts := tables{{f: f, name: TableName, chains: mainChains, sets: mainSets, ports: map[model.ServicePortName]*portObjects{}, counted: newCountedElems()}}
	for i := range serviceTables {
		ts = append(ts, &ruleset{f: f, name: serviceTableName(i), chains: serviceChains, sets: serviceSets,
			ports: map[model.ServicePortName]*portObjects{}, counted: countedElems{}})
	}
	return ts
}

// add puts the two parts of a port's objects (split) in their tables.
func (ts tables) add(name model.ServicePortName, objs *portObjects) {
	main, service := split(objs)
	ts.main().ports[name] = main
	ts.main().counted.add(main, 1)
	ts.service(objs.table).ports[name] = service
}

// split parts a port's objects into those of the main table (its
// firewall chain, its elements in the filter hooks' maps and in the
// counted sets) and those of its service table (its elements in the
// dispatch maps, and every other chain and set).
func split(objs *portObjects) (main, service *portObjects) {
	main = &portObjects{counted: objs.counted, table: objs.table}
	service = &portObjects{sets: objs.sets, anonElems: objs.anonElems, endpoints: objs.endpoints, table: objs.table}
	for _, c := range objs.chains {
		if strings.HasPrefix(c.Name, prefixFirewall) {
			main.chains = append(main.chains, c)
		} else {
			service.chains = append(service.chains, c)
		}
	}
	for _, sh := range objs.shared {
		part := main
		if dispatchMaps[sh.set] {
			part = service
		}
		part.shared = append(part.shared, sh)
	}
	service.countsPort = len(service.shared) > 0
	main.countsPort = !service.countsPort && len(main.shared) > 0
	return main, service
}

// dispatchMaps are the shared maps of the service tables: those that
// send a new connection to its port's chains.
var dispatchMaps = map[string]bool{mapServiceIPs: true, mapServiceNodePorts: true}

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

// renderFixed returns the chains and sets the main table has whatever
// the services, and those each service table has.
func renderFixed(f *family, np *dataplane.NodePolicy) (mainChains []*chain, mainSets []*set, serviceChains []*chain, serviceSets []*set) {
	base := func(name string, typ nftables.ChainType, hookName string, num uint32, prio nftables.ChainPriority, rules ...*nft.Builder) *chain {
		return &chain{Name: name, Hook: &hook{Type: typ, Name: hookName, Num: nftables.ChainHook(num), Priority: prio}, Rules: built(rules)}
	}
	regular := func(name string, rules ...*nft.Builder) *chain {
		return &chain{Name: name, Rules: built(rules)}
	}
	r := func() *nft.Builder { return nft.NewRule(f) }

	// Cluster-IP traffic is marked for masquerading by one rule for every
	// port (the ports put their cluster IP in cluster-ips), before a
	// service table's DNAT. Traffic to a port the cluster IP does not
	// have is marked too, and rejected after DNAT (cluster-ips-check): it
	// never leaves the node.
	var mark []*nft.Builder
	switch {
	case np.MasqueradeAll:
		mark = append(mark, r().AddrInSet("daddr", false, setClusterIPs).Jump(chainMarkMasq))
	case len(np.ClusterCIDRs) > 0:
		mark = append(mark, r().AddrInSet("daddr", false, setClusterIPs).AddrInSet("saddr", true, setClusterCIDRs).Jump(chainMarkMasq))
	}
	endpointCheck := []*nft.Builder{r().VmapService(mapNoEndpointServices)}
	services := []*nft.Builder{r().VmapService(mapServiceIPs)}
	if nodePort := nodePortMatch(f, np); nodePort != nil {
		services = append(services, nodePort().VmapProtoPort(mapServiceNodePorts))
		endpointCheck = append(endpointCheck, nodePort().VmapProtoPort(mapNoEndpointNodePorts))
	}
	markMasq := regular(chainMarkMasq, r().MarkSet(np.MasqueradeMark))

	mainChains = []*chain{
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
		base(chainNATPrerouting, nftables.ChainTypeNAT, "prerouting", unix.NF_INET_PRE_ROUTING, priorityMark, mark...),
		base(chainNATOutput, nftables.ChainTypeNAT, "output", unix.NF_INET_LOCAL_OUT, priorityMark, mark...),
		base(chainNATPostrouting, nftables.ChainTypeNAT, "postrouting", unix.NF_INET_POST_ROUTING, prioritySNAT,
			r().Jump(chainMasquerading)),
		regular(chainEndpointCheck, endpointCheck...),
		regular(chainFirewallCheck, r().VmapService(mapFirewallIPs)),
		regular(chainClusterIPCheck, r().AddrInSet("daddr", false, setClusterIPs).Goto(chainReject)),
		// TCP gets a reset rather than ICMP: ICMPv6 port unreachable for a
		// forwarded or local connection did not reliably reach the
		// client's socket in our tests, a reset does in both families.
		regular(chainReject, r().RejectTCP(), r().Reject()),
		markMasq,
		regular(chainMasquerading,
			// Hairpin (an endpoint reached itself through a service) is
			// marked here, before the mark is tested, so that every
			// masquerade goes through the one rule below.
			r().CtStatusDNAT().AddrPairInSet(setHairpin).MarkSet(np.MasqueradeMark),
			r().MarkUnset(np.MasqueradeMark).Return(),
			r().MarkClear(np.MasqueradeMark),
			r().Masquerade()),
	}
	serviceChains = []*chain{
		base(chainNATPrerouting, nftables.ChainTypeNAT, "prerouting", unix.NF_INET_PRE_ROUTING, priorityDNAT,
			r().Jump(chainServices)),
		base(chainNATOutput, nftables.ChainTypeNAT, "output", unix.NF_INET_LOCAL_OUT, priorityDNAT,
			r().Jump(chainServices)),
		markMasq,
		regular(chainServices, services...),
	}
	sortRegular(mainChains)
	sortRegular(serviceChains)

	addrProtoPort := nftables.MustConcatSetType(f.AddrType, nftables.TypeInetProto, nftables.TypeInetService)
	protoPort := nftables.MustConcatSetType(nftables.TypeInetProto, nftables.TypeInetService)
	addrText := f.AddrType.Name + " . inet_proto . inet_service"
	vmap := func(name string, t nftables.SetDatatype, text string) *set {
		return &set{name: name, keyType: t, keyText: text, verdictMap: true}
	}
	mainSets = []*set{
		vmap(mapFirewallIPs, addrProtoPort, addrText),
		vmap(mapNoEndpointNodePorts, protoPort, "inet_proto . inet_service"),
		vmap(mapNoEndpointServices, addrProtoPort, addrText),
		// Their elements belong to the service ports, counted in
		// ruleset.counted.
		{name: setHairpin, keyType: nftables.MustConcatSetType(f.AddrType, f.AddrType), keyText: f.AddrType.Name + " . " + f.AddrType.Name},
		{name: setClusterIPs, keyType: f.AddrType, keyText: f.AddrType.Name},
	}
	serviceSets = []*set{
		vmap(mapServiceIPs, addrProtoPort, addrText),
		vmap(mapServiceNodePorts, protoPort, "inet_proto . inet_service"),
	}
	// Both kinds of table match sources in the pod networks (the main
	// table to mark cluster-IP traffic, the external chains to route it)
	// and NodePort addresses.
	if len(np.ClusterCIDRs) > 0 {
		s := &set{name: setClusterCIDRs, keyType: f.AddrType, keyText: f.AddrType.Name, interval: true}
		for _, p := range np.ClusterCIDRs {
			s.elems = append(s.elems, prefixElement(f, p))
		}
		mainSets, serviceSets = append(mainSets, s), append(serviceSets, s)
	}
	if !np.NodePortsAnyLocal && len(np.NodePortIPs) > 0 {
		s := &set{name: setNodePortIPs, keyType: f.AddrType, keyText: f.AddrType.Name}
		for _, ip := range np.NodePortIPs {
			s.elems = append(s.elems, newElement(f.Bytes(ip), nil, nil, ip.String(), ""))
		}
		mainSets, serviceSets = append(mainSets, s), append(serviceSets, s)
	}
	bySetName := func(a, b *set) int { return cmp.Compare(a.name, b.name) }
	slices.SortFunc(mainSets, bySetName)
	slices.SortFunc(serviceSets, bySetName)
	return mainChains, mainSets, serviceChains, serviceSets
}

// sortRegular sorts the chains after the base chains by name.
func sortRegular(chains []*chain) {
	first := slices.IndexFunc(chains, func(c *chain) bool { return c.Hook == nil })
	slices.SortFunc(chains[first:], func(a, b *chain) int { return cmp.Compare(a.Name, b.Name) })
}

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

// renderPort describes the objects of one service port, as np's policy
// for it decides, in both its tables (see split).
func renderPort(f *family, sp *model.ServicePort, np *dataplane.NodePolicy) *portObjects {
	pol := np.PortPolicy(sp)
	n := namesFor(sp.Name)
	objs := &portObjects{table: n.table}
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
		objs.addPolicyChain(f, sp, n, n.service, n.serviceMap, pol.Cluster)
	}
	if pol.Local != nil {
		objs.addPolicyChain(f, sp, n, n.local, n.localMap, pol.Local)
	}
	// Hairpin: an endpoint reaching its own service must see the reply
	// come from the node, not from itself. The masquerading chain
	// matches the pairs of the hairpin set, whatever port put them there.
	// Only this node's endpoints can hairpin through its rules (a pod
	// elsewhere reaches its service through its own node), so only they
	// have pairs, as in kube-proxy.
	seen := map[netip.Addr]bool{}
	for _, ep := range pol.Endpoints() {
		if ep.IsLocal && !seen[ep.IP] {
			seen[ep.IP] = true
			objs.counted.add(setHairpin, hairpinElement(f, ep.IP))
		}
		if sp.AffinityTimeout == 0 {
			continue
		}
		// ClientIP affinity: one chain per endpoint, which records the
		// client in the endpoint's affinity set and DNATs.
		objs.endpoints++
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

// addPolicyChain adds a chain choosing one of eps at random. (Cluster-IP
// traffic is marked for masquerading before it gets here, in the main
// table.)
//
// Without ClientIP affinity, the chain is one rule: DNAT to an endpoint
// drawn from an anonymous map of eps (nft.Builder.DNATRandom), as
// kube-proxy writes it. An endpoint change replaces the rule, which
// makes the kernel validate the rule's table: the port's service table,
// a sixteenth of the service ports (see serviceTables).
//
// With affinity, the chain first sends clients found in an endpoint's
// affinity set to that endpoint's chain, then picks an endpoint chain
// through a numgen verdict map: the endpoint chain records the client.
func (objs *portObjects) addPolicyChain(f *family, sp *model.ServicePort, n servicePortNames, name, mapName string, eps []model.Endpoint) {
	r := func() *nft.Builder { return nft.NewRule(f) }
	c := &chain{Name: name}
	if sp.AffinityTimeout == 0 {
		to := make([]netip.AddrPort, len(eps))
		for i, ep := range eps {
			to[i] = netip.AddrPortFrom(ep.IP, uint16(ep.Port))
		}
		c.Rules = append(c.Rules, r().DNATRandom(sp.Protocol, to).Rule())
		objs.chains = append(objs.chains, c)
		objs.anonElems += len(eps)
		objs.endpoints += len(eps)
		return
	}
	m := &set{name: mapName, keyType: nftables.TypeInteger, keyText: "integer", verdictMap: true, numgenKey: affinityNumgenKey}
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

// affinityNumgenKey is what nft is told the keys of the numgen verdict
// maps of ClientIP affinity come from ("typeof numgen random mod 65536"):
// a type, the same for every map, not the rule's modulus (the number of
// endpoints).
const affinityNumgenKey = 65536

// hairpinElement is the hairpin set's element for an endpoint address:
// the pair "address . address", a connection from the endpoint to itself.
func hairpinElement(f *family, ip netip.Addr) element {
	return newElement(append(f.Bytes(ip), f.Bytes(ip)...), nil, nil, ip.String()+" . "+ip.String(), "")
}
