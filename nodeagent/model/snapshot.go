package model

import corev1 "k8s.io/api/core/v1"

// Snapshot is the complete model at one instant: every service port of
// each IP family. Dataplanes render from it and never from API objects.
type Snapshot struct {
	// Ports holds each family's service ports by name.
	Ports map[corev1.IPFamily]map[ServicePortName]*ServicePort
}

// ChangeSet is the set of service ports whose model changed since the last
// snapshot, in any family. A name in it that is absent from the snapshot
// was deleted.
type ChangeSet map[ServicePortName]struct{}
