// Package v1alpha1 holds the proxyshift API: ProxyConfig, the desired
// service-proxy mode for a set of nodes and how to roll it out, and
// ProxyNode, the per-node record the operator and the agent share.
//
// Validation lives in the schema itself (OpenAPI and CEL markers), so the
// API server rejects a bad object before any controller sees it.
//
// +kubebuilder:object:generate=true
// +groupName=network.proxyshift.io
package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

var (
	// GroupVersion is the group and version of every kind in this package.
	GroupVersion = schema.GroupVersion{Group: "network.proxyshift.io", Version: "v1alpha1"}

	// SchemeBuilder registers this package's kinds with a runtime.Scheme.
	SchemeBuilder = &scheme.Builder{GroupVersion: GroupVersion}

	// AddToScheme adds this package's kinds to a runtime.Scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)
