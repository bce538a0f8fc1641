// Package plan is the operator's decision-making, as one pure function:
// Plan takes a ProxyConfig (with the status last written), the other
// ProxyConfigs, the Nodes, the ProxyNodes, the Services and the time, and
// returns the ProxyNodes to create and update, the complete new status,
// the events and when to look again. It reads nothing else and changes nothing it is
// given, so every decision is unit-tested (sim_test.go is a simulated
// world of nodes and agents; plan_test.go drives it through hundreds of
// random rollouts and checks the maxUnavailable invariant at every step).
// The rules it implements are described in the controllers package
// documentation.
//
// One file a concern, each step returning what it decided rather than
// setting shared fields:
//
//   - plan.go: Plan, the pass (its input, policy and selected nodes), the
//     choice of branch (decide), and the outcome a branch returns: phase,
//     conditions' reasons and messages, writes, events, failures,
//     deadlines;
//   - policy.go: the spec read and checked (selector, node timeout,
//     canary, maxUnavailable as a budget that cannot fail once parsed);
//   - selection.go: the selected nodes, conflicts, each node's state from
//     its ProxyNode, membership in the current rollout, pending nodes and
//     the preflight check;
//   - findings.go: what will behave differently on the nodes still to
//     move (controllers/findings), and the Critical findings not yet
//     acknowledged, which hold a rollout's start;
//   - rollout.go: starting a rollout, moving it on (canary, pause,
//     batches), settling it;
//   - rollback.go: stopping a rollout and sending its nodes back;
//   - messages.go: the words of conditions and events;
//   - status.go: the outcome as the ProxyConfig's status, and the
//     requeue;
//   - node.go: the node health and failure rules.
package plan
