package cluster

import "github.com/proxyshift/proxyshift/test/controlplane"

// Process is one of the cluster's programs (etcd, kube-apiserver, the
// operator, an agent) running inside a network namespace; see
// controlplane.Process.
type Process = controlplane.Process
