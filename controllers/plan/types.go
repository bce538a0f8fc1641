package plan

import (
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
)

// The annotations the operator keeps on a ProxyNode. They are written in
// the same update as the spec they describe, so a crash can never leave one
// without the other. Together with ProxyNode.spec and ProxyConfig.status
// they are the whole memory of a rollout.
const (
	// AnnotationRollout names the rollout that moved the node to its
	// current spec: "<config name>@<status.startTime in RFC 3339>".
	AnnotationRollout = "network.proxyshift.io/rollout"
	// AnnotationRolledBack is set to the rollout's name when that rollout
	// sent the node back to its previous mode.
	AnnotationRolledBack = "network.proxyshift.io/rolled-back"
	// AnnotationRequestedAt is when the operator last changed the node's
	// spec (RFC 3339 with nanoseconds); the node timeout counts from it.
	AnnotationRequestedAt = "network.proxyshift.io/requested-at"
	// AnnotationPreviousMode is the mode that served traffic on the node
	// (status.activeMode) when a rollout moved it; rollback returns there.
	AnnotationPreviousMode = "network.proxyshift.io/previous-mode"
	// AnnotationPreviousSettings holds, as JSON, the settings the node ran
	// its previous mode with, when its spec had them; absent means none.
	AnnotationPreviousSettings = "network.proxyshift.io/previous-settings"
	// AnnotationPreviousConfig is the configRef ("<name>/<generation>") of
	// the spec that made the node run its previous mode. A rollback writes
	// it back, so the rollback's configRef differs from the failed move's
	// (an agent keys "have I acted on this spec" on configRef). Absent
	// means the previous mode did not come from a ProxyNode spec (the node
	// ran it before proxyshift); the rollback then uses generation 0.
	AnnotationPreviousConfig = "network.proxyshift.io/previous-config"
)

// Reasons of the ProxyConfig conditions. Each says what a person can do.
const (
	ReasonInvalidSpec     = "InvalidSpec"     // fix the spec field named in the message
	ReasonNoNodesSelected = "NoNodesSelected" // the selector matches no node
	ReasonPreflight       = "Preflight"       // waiting for agents to report kernel facts
	ReasonPreflightFailed = "PreflightFailed" // nodes cannot run the mode; nothing was changed
	// ReasonAcknowledgementRequired: Critical findings hold the rollout
	// until spec.rollout.acknowledgedFindings lists their codes.
	ReasonAcknowledgementRequired = "AcknowledgementRequired"
	ReasonCanary                  = "Canary"           // the canary nodes are moving
	ReasonCanaryPause             = "CanaryPause"      // the canary passed; waiting spec.rollout.canary.pause
	ReasonRollingOut              = "RollingOut"       // batches are moving
	ReasonWaitingForNodes         = "WaitingForNodes"  // nodes the rollout did not move are still settling
	ReasonPaused                  = "Paused"           // spec.rollout.paused is set
	ReasonDryRun                  = "DryRun"           // spec.rollout.dryRun is set: status.plan says what would happen
	ReasonCompleted               = "RolloutCompleted" // every node runs the target
	ReasonAllNodesUpdated         = "AllNodesUpdated"  // Ready=True
	ReasonInProgress              = "RolloutInProgress"
	ReasonNodeFailed              = "NodeFailed"     // a node failed; the rollout stopped
	ReasonRollingBack             = "RollingBack"    // moved nodes are returning to their previous mode
	ReasonRolledBack              = "RolledBack"     // rollback finished; the rollout failed
	ReasonRollbackFailed          = "RollbackFailed" // a node failed to return; needs a person
	ReasonNodeUnhealthy           = "NodeUnhealthy"  // a node the rollout cannot act on is failing
	ReasonConflict                = "Conflict"       // nodes are selected by another ProxyConfig too
	ReasonAsExpected              = "AsExpected"
)

// Event reasons.
const (
	EventRolloutStarted   = "RolloutStarted"
	EventCanaryPassed     = "CanaryPassed"
	EventNodeUpdated      = "NodeUpdated"
	EventNodeFailed       = "NodeFailed"
	EventRollbackStarted  = "RollbackStarted"
	EventRolloutCompleted = "RolloutCompleted"
	EventConflict         = "Conflict"
	EventPreflightFailed  = "PreflightFailed"
	// EventAcknowledgementRequired: a rollout started holding on Critical
	// findings.
	EventAcknowledgementRequired = "AcknowledgementRequired"
)

// Defaults for unset policy fields (they match the API defaults, which the
// API server normally fills in).
const (
	DefaultNodeTimeout    = 5 * time.Minute
	DefaultCanaryNodes    = 1
	DefaultMaxUnavailable = 1
)

// Node is what the planner needs of a Node: its identity and labels.
type Node struct {
	Name   string
	UID    types.UID
	Labels map[string]string
	// Deleting is true once the node has a deletion timestamp; it then
	// drops out of every count.
	Deleting bool
}

// Input is everything the planner looks at. The planner never modifies it.
type Input struct {
	// Config is the ProxyConfig to plan for, with the status last written.
	Config *v1alpha1.ProxyConfig
	// Others are the other ProxyConfigs (Config itself may be included;
	// it is skipped by name), for conflict detection.
	Others []v1alpha1.ProxyConfig
	// Nodes are the cluster's nodes (at least every node Config selects).
	Nodes []Node
	// ProxyNodes are the ProxyNodes by name.
	ProxyNodes map[string]*v1alpha1.ProxyNode
	// Now is the current time.
	Now time.Time
	// KubeProxy is what the operator knows of the cluster's kube-proxy.
	KubeProxy KubeProxy
	// Services are the cluster's Services, as findings.Trim keeps them:
	// what the behaviour-diff preflight (controllers/findings) reads.
	Services []*corev1.Service
}

// KubeProxy is what the planner needs to know of kube-proxy's DaemonSet:
// mode kube-proxy needs it, and a node holding kube-proxy's rules cannot
// be taken over while the operator cannot stop kube-proxy there.
type KubeProxy struct {
	// DaemonSet is the configured DaemonSet, "namespace/name"; empty when
	// the operator was told the cluster has no kube-proxy.
	DaemonSet string
	// Found says the DaemonSet exists.
	Found bool
	// ModeFlag is the value of a --proxy-mode flag in the DaemonSet's
	// containers ("" when none): it overrides the ConfigMap's mode.
	ModeFlag string
	// PodNodes are the nodes a pod of the DaemonSet is bound to.
	PodNodes map[string]bool
	// ConfigMap is kube-proxy's configuration, "namespace/name:key"
	// (--kube-proxy-configmap, --kube-proxy-config-key).
	ConfigMap string
	// Config is that ConfigMap; nil when it was not found.
	Config *corev1.ConfigMap
}

// configKey is the key of kube-proxy's configuration in its ConfigMap.
func (k KubeProxy) configKey() string {
	return k.ConfigMap[strings.LastIndexByte(k.ConfigMap, ':')+1:]
}

// Event is an event to record about the ProxyConfig.
type Event struct {
	// Warning is true for Warning events, false for Normal ones.
	Warning bool
	Reason  string
	Message string
	// Node is the node (and ProxyNode) the event is about, if any.
	Node string
}

// Result is what to do: the objects to write, the status, the events, and
// when to look again.
type Result struct {
	// Status is the complete new status of the ProxyConfig.
	Status v1alpha1.ProxyConfigStatus
	// Create are ProxyNodes to create (empty spec, owned by their Node).
	Create []*v1alpha1.ProxyNode
	// Delete are ProxyNodes left by a Node that was replaced by a new one
	// of the same name.
	Delete []*v1alpha1.ProxyNode
	// Update are ProxyNodes with a new spec and annotations; each is a
	// modified copy of the input object (same resourceVersion), to be
	// written with an optimistic-concurrency update.
	Update []*v1alpha1.ProxyNode
	// KubeProxyConfig, when set, is kube-proxy's ConfigMap with a new
	// mode: a modified copy of KubeProxy.Config (same resourceVersion),
	// to be written with an optimistic-concurrency update.
	KubeProxyConfig *corev1.ConfigMap
	// Events are events to record.
	Events []Event
	// Updated names the nodes this rollout moved that now run the target
	// (for NodeUpdated events, which the caller de-duplicates).
	Updated []string
	// RequeueAfter is when to plan again even if nothing changes (a node
	// timeout or the canary pause ends); zero means no need.
	RequeueAfter time.Duration
}
