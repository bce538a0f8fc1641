// Package nodeagent is the per-node half of proxyshift: the agent that
// programs Services into the node's dataplane and switches that dataplane
// when its ProxyNode asks. Each concern lives in its own subpackage.
package nodeagent

// The agent's permissions, rendered into config/rbac/agent by
// `make manifests`. It reads Services, EndpointSlices, Nodes and its
// ProxyNode, and writes only its ProxyNode's status.
//
// +kubebuilder:rbac:groups="",resources=services;nodes,verbs=get;list;watch
// +kubebuilder:rbac:groups=discovery.k8s.io,resources=endpointslices,verbs=get;list;watch
// +kubebuilder:rbac:groups=network.proxyshift.io,resources=proxynodes,verbs=get;list;watch
// +kubebuilder:rbac:groups=network.proxyshift.io,resources=proxynodes/status,verbs=get;update;patch
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch
