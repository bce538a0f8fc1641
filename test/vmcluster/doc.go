// Package vmcluster holds the end-to-end test of IPVS: the operator and
// the agent binary move the nodes of a small lab between iptables, ipvs
// and nftables through real ProxyConfig rollouts, inside the test VM
// (make test-vm), whose Debian kernel has the IPVS modules the host's
// lacks.
//
// The pieces are those of the host's end-to-end tests, placed for the VM:
// the test API server runs on the host (the VM's emulated CPU would take
// minutes to start it) and the guest reaches it through qemu's user-mode
// network (hack/vm/README.md, "The API server"); the operator runs in the
// test's process (as test/rollout runs it); each node is a test/netlab
// node namespace with pods on two nodes joined by one uplink segment, and
// its agent is the static proxyshift-agent binary (cmd/agent) in the
// VM's own namespace, where the API server is reachable, programming the
// node's namespace through its --netns flag (as in test/switch). A client
// namespace keeps opening connections through a cluster IP and both
// nodes' NodePorts, and holds long-lived ones, while the rollouts run.
//
// The package has no non-test code.
package vmcluster
