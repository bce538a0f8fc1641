// Package iptables is proxyshift's iptables dataplane: it programs the
// service model as chains of iptables rules in the nat and filter tables,
// with iptables-restore, for hosts and kernels where iptables is the tool
// of choice (or the only one a host's other software understands).
//
// Why it looks the way it does:
//
//   - One iptables-restore --noflush run per family per sync, built in
//     memory: the kernel sees each table change as one transaction, and
//     the cost of starting a process and of iptables' own bookkeeping
//     (for the legacy variant, reading and replacing the whole table) is
//     paid once per sync, not once per rule. The one exception is
//     filling empty tables (a switch into iptables) with many ports on
//     the nft variant: two restores then parse their halves at once, on
//     two CPUs, between a restore of the fixed chains and one of the jump
//     rules that make the whole reachable.
//   - It owns only chains named PROXYSHIFT-*, plus one jump rule per
//     built-in chain it hooks, which it inserts and deletes itself. It
//     never flushes a built-in chain nor declares one (a declaration would
//     reset its policy).
//   - Incremental syncs touch only the chains and rules of the service
//     ports that changed: rules in the shared dispatch chains are deleted
//     by their exact text (every one carries its port's name in a comment)
//     and inserted at the top; per-port chains are rewritten only if their
//     rules changed. A periodic full sync reads the tables back and
//     rewrites everything, which repairs drift.
//   - The decisions (which endpoints, masquerade, drop or reject) come
//     from dataplane.PortPolicy, shared with the other dataplanes; this
//     package only says them in iptables' words.
//   - iptables 1.8 has two variants, legacy and nft, with separate rules
//     in the kernel. The backend programs the one the host uses (Detect,
//     the way kube-proxy's iptables wrappers decide), never both, and
//     removes its own objects from the other; KernelFacts reports both.
//   - Like kube-proxy's iptables mode, it accepts forwarded service
//     traffic in iptables' FORWARD chain (PROXYSHIFT-FORWARD), so that
//     Services work on hosts whose FORWARD policy is DROP, and, with
//     WithLocalhostNodePorts, serves NodePorts on 127.0.0.1 (IPv4) with
//     the route_localnet sysctl and a drop of martian connections.
//   - Restarts keep traffic flowing: New changes nothing, and the first
//     sync rewrites proxyshift's chains in place in one transaction.
//
// The README next to this file describes every chain and the path of a
// packet through them for each kind of service.
package iptables
