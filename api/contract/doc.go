// Package contract is the agreement between the operator and the agent,
// written once so that the two sides cannot drift apart: which kernel
// modules each proxy mode needs, the IPVS schedulers the API accepts and
// the module each one needs, the default scheduler, the conditions and
// reasons an agent writes on its ProxyNode and how the operator reads them
// (the node health rule), and how a ProxyNode's spec.settings are read
// into plain values.
//
// The operator (controllers/preflight, controllers/plan) checks a node's
// reported kernel facts and conditions with it; the agent (nodeagent/kmod
// through its callers, nodeagent/facts, nodeagent/report, the backend
// factories) loads, reports and configures with it. The API's validation
// markers must accept exactly what is listed here: schedulers_test.go checks
// the generated CRDs' enums against Modes and Schedulers.
//
// It imports nothing of the project but the API types. The dataplane
// backends do not import it: they take the plain values it produces (a
// scheduler name, a list of modules, durations and prefixes), so that they
// know nothing of the API.
package contract
