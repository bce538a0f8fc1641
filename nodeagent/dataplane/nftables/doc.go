// Package nftables is proxyshift's nftables dataplane: it programs the
// service model into one table named "proxyshift" per IP family (ip and
// ip6), over netlink with github.com/google/nftables, and touches nothing
// outside those tables.
//
// Why it looks the way it does:
//
//   - Lookups cost the same for ten services or ten thousand: a packet
//     finds its service by one lookup of destination address . protocol .
//     port in a verdict map, instead of walking a chain of rules as
//     iptables does.
//   - A sync is one netlink transaction per family, which the kernel
//     applies whole or not at all, so packets never see a half-written
//     table; an incremental sync writes only the changed service ports'
//     elements and chains.
//   - An endpoint change adds no rule: a service port's chain DNATs with
//     one constant rule through a map of endpoint addresses (shared by 16
//     ports), so the change only rewrites map elements, which the kernel
//     commits without re-validating the whole table (a new rule or a
//     jumping verdict would make it walk every chain). Hairpin is one
//     rule at postrouting with a reference-counted set of endpoint
//     pairs. Ports with ClientIP affinity keep a chain per endpoint.
//   - Rendering is pure and separate from kernel I/O: render turns the
//     model into a description of the table (chains, rules, sets, maps
//     and elements) that dumps as nft-like text, which golden tests pin
//     down; fullPlan and incrementalPlan turn descriptions into a list of
//     operations, also without a kernel; queue turns operations into
//     google/nftables calls. Rules, families, set definitions and the
//     transaction that sends a batch are the shared low-level layer
//     (../internal/nft), which the ipvs backend's helper table uses too.
//   - Restarts keep traffic flowing: New does not touch the kernel, and
//     the first sync rewrites the table in place in one transaction,
//     keeping the ClientIP affinity state.
//   - Base-chain priorities put proxyshift ahead of kube-proxy (nftables
//     or iptables) on a node where both run, so that a node can switch
//     to proxyshift before kube-proxy's rules are removed.
//
// The README next to this file describes every chain, map and set and
// the path of a packet through them for each kind of service.
package nftables
