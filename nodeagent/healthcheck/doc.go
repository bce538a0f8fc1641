// Package healthcheck serves the HTTP endpoints that cloud load balancers
// and kubelets probe kube-proxy for, once proxyshift serves the node in
// kube-proxy's place: the health-check node port of every LoadBalancer
// Service with externalTrafficPolicy Local (200 while the node has local
// ready endpoints for it, else 503, so the load balancer sends the
// Service's traffic only to nodes that can keep it local) and the
// node-level /healthz and /livez on kube-proxy's health port (10256).
//
// kube-proxy owns those ports while it runs on the node, so they are bound
// only while proxyshift serves it (Serving) and released before the node
// is handed back. The parts that decide (which checks, on which addresses,
// with which counts, whether the node is eligible) are pure functions;
// Server only opens and closes listeners to match them and answers
// requests, as kube-proxy's pkg/proxy/healthcheck does (v1.37).
package healthcheck
