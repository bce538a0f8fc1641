// Package plan is the operator's decision-making, as one pure function:
// Plan takes a ProxyConfig (with the status last written), the other
// ProxyConfigs, the Nodes, the ProxyNodes and the time, and returns the
// ProxyNodes to create and update, the complete new status, the events and
// when to look again. It reads nothing else and changes nothing it is
// given, so every decision is unit-tested (plan_test.go drives a simulated
// world of nodes and agents through hundreds of random rollouts and checks
// the maxUnavailable invariant at every step). The rules it implements are
// described in the controllers package documentation.
package plan
