// Package nftables is proxyshift's nftables dataplane: it programs the
// service model, in each IP family (ip and ip6), into a main table named
// "proxyshift" and sixteen service tables ("proxyshift-services-0" to
// "-15"), over netlink with github.com/google/nftables, and touches
// nothing outside those tables.
//
// Why it looks the way it does:
//
//   - Lookups cost the same for ten services or ten thousand: a packet
//     finds its service by one lookup of destination address . protocol .
//     port in a verdict map, instead of walking a chain of rules as
//     iptables does.
//   - A service port's chain DNATs with one rule that holds its endpoints
//     in an anonymous map, as kube-proxy's does, so the tables take no
//     more room than kube-proxy's. An endpoint change replaces that rule,
//     and the kernel validates the whole table a NAT rule is added to
//     (it walks every chain the base chains reach): the ports' dispatch
//     and DNAT chains are therefore spread over sixteen service tables,
//     and a change pays for one of them. Hairpin is one rule at
//     postrouting with a reference-counted set of endpoint pairs. Ports
//     with ClientIP affinity keep a chain per endpoint.
//   - A sync is one netlink transaction per table, which the kernel
//     applies whole or not at all, so packets never see a half-written
//     table (not one per family: binding an anonymous map, the kernel
//     walks the transaction so far); an incremental sync writes only the
//     changed service ports' elements and chains.
//   - Rendering is pure and separate from kernel I/O: render turns the
//     model into a description of the table (chains, rules, sets, maps
//     and elements) that dumps as nft-like text, which golden tests pin
//     down; fullPlan and incrementalPlan turn descriptions into a list of
//     operations, also without a kernel; queue turns operations into
//     google/nftables calls. Rules, families, set definitions and the
//     transaction that sends a batch are the shared low-level layer
//     (../internal/nft), which the ipvs backend's helper table uses too.
//   - Restarts keep traffic flowing: New does not touch the kernel, and
//     the first sync rewrites the tables in place, keeping the ClientIP
//     affinity state.
//   - Base-chain priorities put proxyshift ahead of kube-proxy (nftables
//     or iptables) on a node where both run, so that a node can switch
//     to proxyshift before kube-proxy's rules are removed.
//
// The README next to this file describes every chain, map and set and
// the path of a packet through them for each kind of service.
package nftables
