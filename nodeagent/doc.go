// Package nodeagent is the per-node half of proxyshift: the agent that
// programs Services into the node's dataplane and switches that dataplane
// when its ProxyNode asks. Each concern lives in its own subpackage.
package nodeagent

// The agent's permissions, rendered into config/rbac/agent by
// `make manifests`; config/rbac/README.md says what uses each verb. It
// lists and watches Services, EndpointSlices, its Node and its ProxyNode
// (informers; no get), patches ProxyNode status (the API server's
// admission policy in config/policy limits that to its own node's), and
// records Events (events.k8s.io) on Services whose external address it
// refuses or whose health-check node port it cannot bind.
//
// +kubebuilder:rbac:groups="",resources=services;nodes,verbs=list;watch
// +kubebuilder:rbac:groups=discovery.k8s.io,resources=endpointslices,verbs=list;watch
// +kubebuilder:rbac:groups=network.proxyshift.io,resources=proxynodes,verbs=list;watch
// +kubebuilder:rbac:groups=network.proxyshift.io,resources=proxynodes/status,verbs=patch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch
