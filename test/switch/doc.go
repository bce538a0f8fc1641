// Package switchtest holds the mode-switch tests: the real agent binary,
// run as a process against a real API server, switches a lab node (a
// network namespace routing clients to pod namespaces, see test/netlab)
// between dataplane modes while clients keep opening connections through
// service addresses. The tests write ProxyNode specs directly, as the
// operator would, and read the agent's answers from ProxyNode status.
//
// The agent runs in the root network namespace, where it reaches the test
// API server on 127.0.0.1, and programs the lab node's namespace through
// its test-only --netns flag (which makes every backend, probe, conntrack
// and cleanup operation target /run/netns/NAME). The test-only
// --test-stop-at-phase flag makes it hang after a phase's work so a test
// can kill -9 it there; --test-fail-verify makes Verifying fail.
//
// The package has no non-test code.
package switchtest
