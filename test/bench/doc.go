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
// a connection to the changed Service reaches its new endpoint. The
// programs' metrics (kube-proxy's kubeproxy_sync_*, proxyshift's
// proxyshift_sync_*) give the sync durations next to them.
//
// The lab (see Lab): the node namespace, where the program under test runs
// (through `ip netns exec`), reaches the API server on the root
// namespace's loopback through a relay listening on its own loopback; a
// veth joins it to the backends namespace, which takes every address of
// EndpointCIDR as local (an AnyIP route) and answers on the endpoints'
// port with the address the connection reached, so the prober knows which
// endpoint served it. Addresses come from 198.18.0.0/15 only; nothing
// touches the root namespace's interfaces or netfilter.
package bench
