// Package bench measures proxyshift's agent beside kube-proxy itself: the
// same Services and EndpointSlices in one real API server, each program in
// a network namespace of its own, in the same mode, one after the other,
// measured from outside the same way.
//
// Why from outside: each program's own metrics say how long its code
// thought a sync took, but users feel the time until traffic works. So
// every figure that can be is taken with real connections from inside the
// node's namespace to real backends in another namespace: the first full
// sync ends when the last Service answers; a programming latency ends when
// a connection to the changed Service reaches its new endpoint (the
// report gives the part of it the API server's write took, the update
// call's own time, beside it: on these machines it was most of the
// slowest changes' latency). The
// programs' metrics (kube-proxy's kubeproxy_sync_*, proxyshift's
// proxyshift_sync_*) give the sync durations next to them.
//
// Both programs run as they ship: each gets only what the lab needs (the
// mode, the kubeconfig, the node name, the cluster CIDR, and for
// kube-proxy its metrics and health addresses and no conntrack sysctls,
// and for both the profiles below), listed in the report's header;
// proxyshift's agent follows its node's ProxyNode, which the benchmark
// writes as the operator would.
//
// The mode switch (switch.go): at the largest size, after the other
// figures, the benchmark switches the agent's node nftables -> iptables
// -> nftables through the ProxyNode spec and times each switch from the
// spec write, and from the status showing Preparing, until the status
// says Active in the new mode, while a prober opens a new connection
// through the rules every 5 ms and counts the failures.
//
// Memory (heap.go): both programs serve Go's profiles on their metrics
// address (proxyshift's --profiling, kube-proxy's enableProfiling; the
// only setting added for the benchmark, idle until asked). The benchmark
// reads each one's heap in use every HeapSampleEvery from its metrics,
// and takes one heap profile once the first sync has settled (none
// during it: writing a profile costs the program CPU); the report gives
// the peaks, the bytes allocated until then, and, for proxyshift at the
// largest size, the functions that hold and allocate the most. Peak RSS
// is the kernel's VmHWM. The process tree's peak (tree.go) adds the
// commands a program runs (iptables-restore and iptables-save in
// iptables mode): the resident sets of the program and its descendants
// summed every TreeSampleEvery, the largest sum kept. For a program
// whose first sync gave up, both are what it used until then, lower
// bounds of its peaks.
//
// The ruleset (rulesetsize.go, kmem.go): once the first sync has
// settled, `nft list ruleset` in the node namespace, its length and
// what the bytes are; and at the end of the run what the kernel holds
// for it. Each program runs in a memory cgroup of its own, to which
// nf_tables charges the tables, chains, rules, sets and elements its
// netlink requests create; once the program has stopped (leaving its
// rules, as on a node), the benchmark deletes the namespace's tables and
// takes the fall of the cgroup's kernel memory. Not in IPVS mode, whose
// virtual services are no nftables objects.
//
// The report (report.go, chart.go) is Markdown tables with p50, p90,
// p99, the maximum and the sample counts, and PNG charts drawn with
// gonum/plot: first sync and peak RSS against Service count, and a
// programming-latency CDF per mode and size for both programs.
//
// The lab (see Lab): the node namespace, where the program under test runs
// (through `ip netns exec`), reaches the API server on the root
// namespace's loopback through a relay listening on its own loopback,
// and through the kubernetes Service too: the API server advertises
// APIAdvertiseIP, which the node namespace holds, with a second relay at
// the API server's port (so the agent's probes of that Service answer,
// as in a cluster; they used to wait 2 s for it in every switch); a
// veth joins it to the backends namespace, which takes every address of
// EndpointCIDR as local (an AnyIP route) and answers on the endpoints'
// port with the address the connection reached, so the prober knows which
// endpoint served it. Addresses come from 198.18.0.0/15 only; nothing
// touches the root namespace's interfaces or netfilter.
package bench
