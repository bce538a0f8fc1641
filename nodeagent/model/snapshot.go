package model

import (
	"time"

	corev1 "k8s.io/api/core/v1"
)

// Snapshot is the complete model at one instant: every service port of
// each IP family. Dataplanes render from it and never from API objects.
// Nothing changes a ServicePort once a snapshot holds it (a change
// publishes a new one), so a dataplane may keep the ports, and their
// endpoint arrays, from one sync to the next.
type Snapshot struct {
	// Ports holds each family's service ports by name.
	Ports map[corev1.IPFamily]map[ServicePortName]*ServicePort
	// Triggers are the trigger times of the EndpointSlice changes this
	// snapshot is the first to hold (see Trigger).
	Triggers []Trigger
}

// Trigger is when a change an EndpointSlice carries was triggered: its
// endpoints.kubernetes.io/last-change-trigger-time annotation, with the
// family of its addresses. Network programming latency is measured from it
// to the end of the sync that programmed the change, as kube-proxy does.
type Trigger struct {
	Family corev1.IPFamily
	Time   time.Time
}

// ChangeSet is the set of service ports whose model changed since the last
// snapshot, in any family. A name in it that is absent from the snapshot
// was deleted.
type ChangeSet map[ServicePortName]struct{}
