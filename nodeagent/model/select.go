package model

// Endpoint selection, as kube-proxy does it (without topology hints): a
// traffic policy uses the ready endpoints it may reach; only when none of
// them is ready does it fall back to those that are still serving while
// terminating, so that connections drain instead of failing during a
// rollout. The fallback is decided separately for the cluster-wide and
// the node-local set.

// ClusterEndpoints returns the endpoints traffic under the Cluster policy
// goes to: the ready ones, or, if none is ready, the serving terminating
// ones. It is empty when the port has no usable endpoint.
func (sp *ServicePort) ClusterEndpoints() []Endpoint {
	return usable(sp.Endpoints, func(Endpoint) bool { return true })
}

// LocalEndpoints returns the endpoints traffic under the Local policy goes
// to: ClusterEndpoints' rule applied to the endpoints on this node only.
func (sp *ServicePort) LocalEndpoints() []Endpoint {
	return usable(sp.Endpoints, func(e Endpoint) bool { return e.IsLocal })
}

// InternalEndpoints returns the endpoints for traffic to the cluster IP:
// LocalEndpoints under internalTrafficPolicy Local, else ClusterEndpoints.
func (sp *ServicePort) InternalEndpoints() []Endpoint {
	if sp.InternalPolicyLocal {
		return sp.LocalEndpoints()
	}
	return sp.ClusterEndpoints()
}

// ExternalEndpoints returns the endpoints for traffic to the node port,
// external IPs and load-balancer IPs: LocalEndpoints under
// externalTrafficPolicy Local, else ClusterEndpoints.
func (sp *ServicePort) ExternalEndpoints() []Endpoint {
	if sp.ExternalPolicyLocal {
		return sp.LocalEndpoints()
	}
	return sp.ClusterEndpoints()
}

// UsesExternal says whether the port takes traffic other than to its
// cluster IP: it has a node port, external IPs or load-balancer IPs.
func (sp *ServicePort) UsesExternal() bool {
	return sp.NodePort != 0 || len(sp.ExternalIPs) > 0 || len(sp.LoadBalancerIPs) > 0
}

// usable returns the ready endpoints among those in scope or, if there are
// none, the serving terminating ones; nil if neither exists.
func usable(eps []Endpoint, inScope func(Endpoint) bool) []Endpoint {
	var ready, draining []Endpoint
	for _, e := range eps {
		switch {
		case !inScope(e):
		case e.Ready:
			ready = append(ready, e)
		case e.Serving && e.Terminating:
			draining = append(draining, e)
		}
	}
	if len(ready) > 0 {
		return ready
	}
	return draining
}
