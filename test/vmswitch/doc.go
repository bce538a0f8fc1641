// Package vmswitch holds the tests that switch a node between IPVS and
// the other modes, inside the test VM (make test-vm): the host's kernel
// has no IPVS. The tests drive the agent's switcher and backends
// in-process, with no API server (test/vmcluster runs the agent binary
// and the operator against one), against a netlab node, under real
// traffic; the
// crash test runs them in a process of their own (this test binary
// again, see TestMain) to kill it with SIGKILL.
package vmswitch
