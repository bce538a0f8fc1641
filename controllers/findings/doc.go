// Package findings works out, before a rollout moves any node, what will
// behave differently on the nodes it moves: the behaviour-diff preflight.
//
// Switching proxy mode is not only a matter of the kernel supporting the
// new mode. kube-proxy's modes and proxyshift's dataplanes differ in
// documented ways (NodePorts on 127.0.0.1, Service IPs that IPVS makes
// local addresses, health-check node ports proxyshift does not serve
// yet, ...), and users tend to find out after the fact. The differences
// that matter depend on what runs in the cluster, so each one is a rule
// over two things the operator already sees: what serves each node now
// (ProxyNode status.activeMode and status.kubeProxyMode) and the
// cluster's Services. A rule that applies becomes a Finding with a stable
// code, a severity, the affected objects (the first ten, and a count) and
// what to do.
//
// Compute is a pure function of its input, like the planner that calls
// it; Trim is the cache transform that keeps only the Service fields the
// rules read, so the operator's cache of Services stays small. Critical
// findings hold a rollout until spec.rollout.acknowledgedFindings lists
// their codes (Unacknowledged). docs/behaviour-differences.md is the
// table of every rule; each rule has its own test.
package findings
