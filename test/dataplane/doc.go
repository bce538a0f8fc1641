// Package dataplane holds the real-packet suite every service-proxy
// backend must pass. Rendering tests prove a backend writes the rules it
// means to; only packets prove the rules do what kube-proxy's do. The suite
// builds a netlab.Lab (a node namespace routing between clients and pod
// namespaces), programs a fixed set of services into the node's namespace
// through the dataplane.Backend interface, and checks each behaviour with
// real TCP and UDP traffic from the clients: load balancing, session
// affinity and its release after the affinity timeout, NodePorts, external and load-balancer IPs with source ranges,
// Service IPs that are not a Service's own (another Service's cluster IP,
// the node's address, named as externalIPs), rejecting services without
// endpoints, externalTrafficPolicy Local,
// incremental syncs, restarts, drift repair and cleanup. Files of their
// own check what depends on the host: NodePorts on 127.0.0.1
// (localhost_test.go), hosts whose FORWARD policy is DROP
// (forward_test.go) and SCTP services (sctp_test.go, in the test VM).
// Topology-aware routing (EndpointSlice hints and the node's zone label,
// through the model's Tracker) has its own labs in topology_test.go.
//
// The suite is one table with a row per backend, so every backend is held
// to the same behaviour; see backends in dataplane_test.go. It runs once
// over IPv4 (TestDataplane) and once over IPv6 (TestDataplaneIPv6), with
// the same services at the IPv6 twins of their addresses in the
// dual-stack lab (family_test.go); TestNodeWithoutIPv6 checks that a node
// with IPv6 turned off serves IPv4 and reports the family it lacks. The
// package has no non-test code.
package dataplane
