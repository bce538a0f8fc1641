// Package controllers holds the operator's reconcilers. They stay thin: each
// reads the cluster, hands what it read to a pure planning function, and
// writes the plan's result, so every decision is unit-testable without an
// API server.
package controllers

// The operator's permissions, rendered into config/rbac/operator by
// `make manifests`. It writes ProxyConfig status and ProxyNode spec only,
// reads Nodes, and records Events.
//
// +kubebuilder:rbac:groups=network.proxyshift.io,resources=proxyconfigs,verbs=get;list;watch
// +kubebuilder:rbac:groups=network.proxyshift.io,resources=proxyconfigs/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=network.proxyshift.io,resources=proxynodes,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch
