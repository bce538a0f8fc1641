// Package ipvs is proxyshift's IPVS dataplane: it programs the service
// model into the kernel's IPVS load balancer, with a small nftables table
// doing what IPVS cannot, and touches nothing it did not create.
//
// Why it looks the way it does:
//
//   - IPVS balances connections itself, with a hash lookup per packet and
//     the scheduler the ProxyConfig names (rr, wrr, lc, wlc, lblc, lblcr,
//     sh, dh, sed, nq, mh); session affinity is IPVS persistence. Each
//     destination of a service port (cluster IP, external IP,
//     load-balancer IP, node port on each node address) is a virtual
//     service whose real servers are the endpoints; a terminating endpoint
//     stays with weight 0, so it drains instead of losing its connections.
//   - IPVS only sees packets addressed to the node, so service addresses
//     are bound to a dummy interface of proxyshift's own
//     (DummyInterface), which stays down: its addresses are local, and
//     nothing is routed through it.
//   - IPVS cannot masquerade, refuse connections to services without
//     endpoints, drop externalTrafficPolicy Local traffic on nodes
//     without a local endpoint, or enforce load-balancer source ranges.
//     kube-proxy adds ipsets and iptables rules for that; this package
//     uses one nftables table per IP family (TableName) over netlink
//     instead, built with the nftables layer it shares with the nftables
//     backend (../internal/nft): no iptables or ipset binaries, one
//     atomic transaction per change, and sets and verdict maps that play
//     the part of ipsets. Its rules are fixed; everything per service is a
//     set element, so an incremental sync only adds and removes elements.
//     The decisions themselves come from dataplane.PortPolicy, shared with
//     the other backends, so that every mode treats traffic alike.
//   - The backend owns only what it created. IPVS has one table per
//     network namespace, shared with anyone else who uses it, so there is
//     never a flush: a virtual service is the backend's when the helper
//     table records it (every one it creates, with its service port),
//     when its address is bound to the dummy interface, or when this
//     process programmed it. Foreign virtual services survive syncs,
//     resyncs and Cleanup, and one that sits where a service needs to be
//     is reported as a conflict, never taken over. Virtual services in
//     the ProxyConfig's excludeCIDRs are never deleted, the backend's own
//     included.
//   - Incremental syncs change only the virtual services, real servers,
//     addresses and elements of the service ports that changed; full
//     syncs read the kernel back and repair any drift. New does not touch
//     the kernel, so a restarted agent keeps traffic flowing until its
//     first sync, which finds everything in place and changes nothing.
//   - Leaving IPVS keeps connections: IPVS translates its connections
//     itself, and deletes their conntrack entries when its virtual
//     services go, so Cleanup hands each connection IPVS forwarded over to
//     a conntrack entry with the same NAT, written over ctnetlink, and
//     holds the connection's packets until that is done (handover.go).
//     The mode the node switches to then carries them like its own.
//   - Rendering and planning are pure: renderPort turns a service port
//     into virtual services and elements, fullPlan and incrementalPlan
//     turn them into ordered kernel work, which apply carries out.
//
// The README next to this file describes every object and the path of a
// packet through them for each kind of service.
package ipvs
