// Package vmswitch holds the tests that switch a node between IPVS and
// the other modes, inside the test VM (make test-vm): the host's kernel
// has no IPVS, and the VM cannot host the API server test/switch drives
// the agent binary with. So the tests drive the agent's switcher and
// backends in-process, against a netlab node, under real traffic; the
// crash test runs them in a process of their own (this test binary
// again, see TestMain) to kill it with SIGKILL.
package vmswitch
