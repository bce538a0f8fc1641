package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// ProxyConfigSpec is the desired mode of the selected nodes and how to move
// them there.
// +kubebuilder:validation:XValidation:rule="!has(self.iptables) || self.mode == 'iptables'",message="spec.iptables may only be set when spec.mode is iptables",fieldPath=".iptables"
// +kubebuilder:validation:XValidation:rule="!has(self.nftables) || self.mode == 'nftables'",message="spec.nftables may only be set when spec.mode is nftables",fieldPath=".nftables"
// +kubebuilder:validation:XValidation:rule="!has(self.ipvs) || self.mode == 'ipvs'",message="spec.ipvs may only be set when spec.mode is ipvs",fieldPath=".ipvs"
// +kubebuilder:validation:XValidation:rule="self.mode != 'kube-proxy' || (!has(self.clusterCIDRs) && !has(self.nodePortAddresses))",message="clusterCIDRs and nodePortAddresses cannot be set when spec.mode is kube-proxy: kube-proxy reads its settings from its own ConfigMap"
// +kubebuilder:validation:XValidation:rule="!has(self.kubeProxy) || self.mode == 'kube-proxy'",message="spec.kubeProxy may only be set when spec.mode is kube-proxy: it changes the mode kube-proxy itself runs in",fieldPath=".kubeProxy"
type ProxyConfigSpec struct {
	// Mode is what serves the selected nodes: one of proxyshift's
	// dataplanes (iptables, nftables or ipvs), or kube-proxy to hand them
	// back to the cluster's kube-proxy DaemonSet.
	// +required
	Mode ProxyMode `json:"mode"`

	// NodeSelector selects the nodes this config manages, written as a
	// label selector. Empty selects every node. A node selected by two
	// ProxyConfigs is reported as a conflict and left alone.
	// +optional
	NodeSelector *NodeSelector `json:"nodeSelector,omitempty"`

	ProxySettings `json:",inline"`

	// KubeProxy, with mode kube-proxy, changes the mode kube-proxy itself
	// runs in: proxyshift takes the selected nodes over, changes the mode
	// in kube-proxy's ConfigMap while no kube-proxy pod runs on them, and
	// hands them back one batch at a time to kube-proxy pods that start
	// in the new mode (docs/migrate-kube-proxy-mode.md).
	// +optional
	KubeProxy *KubeProxyModeChange `json:"kubeProxy,omitempty"`

	// Rollout says how nodes are moved to a new mode.
	// +optional
	// +kubebuilder:default={}
	Rollout RolloutPolicy `json:"rollout,omitempty"`
}

// KubeProxyModeChange is a change of kube-proxy's own mode, bridged by
// proxyshift.
type KubeProxyModeChange struct {
	// Mode is the mode kube-proxy runs in once the rollout completes.
	// +required
	// +kubebuilder:validation:Enum=iptables;nftables;ipvs
	Mode ProxyMode `json:"mode"`

	// Bridge is the proxyshift mode that serves the nodes while
	// kube-proxy is reconfigured; it defaults to mode, so traffic
	// already runs on the target dataplane. The bridge runs with the
	// cluster CIDRs and NodePort addresses of kube-proxy's own
	// configuration. ipvs cannot bridge a change to or from kube-proxy's
	// IPVS mode (both program the same IPVS virtual services): the
	// operator refuses it; bridge with nftables or iptables then.
	// +optional
	// +kubebuilder:validation:Enum=iptables;nftables;ipvs
	Bridge ProxyMode `json:"bridge,omitempty"`
}

// BridgeMode is the proxyshift mode that bridges the change: Bridge, or
// Mode when Bridge is empty.
func (c *KubeProxyModeChange) BridgeMode() ProxyMode {
	if c.Bridge != "" {
		return c.Bridge
	}
	return c.Mode
}

// BridgeStage is where a change of kube-proxy's mode stands.
// +kubebuilder:validation:Enum=TakingOver;ReconfiguringKubeProxy;HandingBack;Completed
type BridgeStage string

// The stages of a change of kube-proxy's mode, in order. A rollback runs
// them again towards kube-proxy's previous mode.
const (
	// BridgeTakingOver: proxyshift takes the selected nodes over and
	// kube-proxy's pods leave them.
	BridgeTakingOver BridgeStage = "TakingOver"
	// BridgeReconfiguring: no kube-proxy pod runs on the selected nodes;
	// the operator writes the new mode into kube-proxy's ConfigMap.
	BridgeReconfiguring BridgeStage = "ReconfiguringKubeProxy"
	// BridgeHandingBack: the nodes are handed back, batch by batch, to
	// kube-proxy pods that start in the new mode.
	BridgeHandingBack BridgeStage = "HandingBack"
	// BridgeCompleted: every selected node is served by kube-proxy in the
	// new mode (or, after a rollback, in its previous one).
	BridgeCompleted BridgeStage = "Completed"
)

// KubeProxyBridgeStatus is the progress of a change of kube-proxy's mode.
type KubeProxyBridgeStatus struct {
	// ObservedGeneration is the ProxyConfig generation the change is for.
	ObservedGeneration int64 `json:"observedGeneration"`
	// Stage is where the change stands.
	Stage BridgeStage `json:"stage"`
	// From is the mode kube-proxy ran in before the change.
	From ProxyMode `json:"from"`
	// To is the mode kube-proxy is being moved to: spec.kubeProxy.mode,
	// or From while rolling back.
	To ProxyMode `json:"to"`
	// Requested is the spec.kubeProxy.mode the change was started for,
	// which To no longer says while rolling back. An edit of the spec that
	// keeps it, the bridge mode and the ConfigMap (a pause, a new node
	// timeout) goes on with the change where it stands.
	// +optional
	Requested ProxyMode `json:"requested,omitempty"`
	// Bridge is the proxyshift mode serving the nodes meanwhile.
	Bridge ProxyMode `json:"bridge"`
	// ConfigMap is kube-proxy's configuration, "namespace/name:key".
	ConfigMap string `json:"configMap"`
	// RollingBack is set once the change failed and the nodes return to
	// kube-proxy in its previous mode.
	// +optional
	RollingBack bool `json:"rollingBack,omitempty"`
	// Failure is why the change is rolling back.
	// +optional
	Failure string `json:"failure,omitempty"`
}

// RolloutPolicy bounds how many nodes change at once and what happens when
// one fails.
type RolloutPolicy struct {
	// MaxUnavailable is how many nodes may be in transition at once: a
	// number, or a percentage of the selected nodes (rounded down, at least 1).
	// +optional
	// +kubebuilder:default=1
	// +kubebuilder:validation:XIntOrString
	// +kubebuilder:validation:XValidation:rule="type(self) == int ? self >= 1 : self.matches('^([1-9][0-9]?|100)%$')",message="must be a number of nodes of at least 1, or a percentage from 1% to 100%"
	MaxUnavailable *intstr.IntOrString `json:"maxUnavailable,omitempty"`

	// Canary is the first batch, alone, before all others.
	// +optional
	// +kubebuilder:default={}
	Canary CanaryPolicy `json:"canary,omitempty"`

	// NodeTimeout is how long one node may take to switch before it counts
	// as failed.
	// +optional
	// +kubebuilder:default="5m"
	NodeTimeout Duration `json:"nodeTimeout,omitempty"`

	// AutoRollback returns the nodes a failed rollout moved to their
	// previous mode.
	// +optional
	// +kubebuilder:default=true
	AutoRollback *bool `json:"autoRollback,omitempty"`

	// Paused stops new nodes from starting; the rollout resumes where it
	// stopped when cleared.
	// +optional
	Paused bool `json:"paused,omitempty"`

	// DryRun makes the operator compute the rollout and publish it in
	// status.plan (the nodes, in batches, the canary first, and each
	// node's preflight outcome) without changing any node. Clearing it
	// starts that very plan if nothing else changed. A rollback under
	// way still finishes.
	// +optional
	DryRun bool `json:"dryRun,omitempty"`
	// AcknowledgedFindings are codes of status.findings a person has read
	// and accepts. A rollout does not start while a Critical finding's
	// code is missing here: it holds in phase Preflight, and the
	// Progressing condition names the codes to acknowledge. Warning and
	// Info findings never hold a rollout.
	// +optional
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:MaxLength=64
	// +kubebuilder:validation:items:Pattern=`^[A-Z][A-Za-z0-9]*$`
	// +listType=set
	AcknowledgedFindings []string `json:"acknowledgedFindings,omitempty"`
}

// CanaryPolicy is the canary batch: moved first, then checked, then
// optionally waited on before the rest.
type CanaryPolicy struct {
	// Nodes is how many nodes form the canary; 0 skips the canary.
	// +optional
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=50
	Nodes *int32 `json:"nodes,omitempty"`

	// Pause is how long to wait after the canary succeeded before the
	// next batch.
	// +optional
	Pause Duration `json:"pause,omitempty"`
}

// RolloutPhase is where a ProxyConfig's rollout stands.
// +kubebuilder:validation:Enum=Pending;Preflight;Planned;Progressing;Paused;Completed;RollingBack;Failed
type RolloutPhase string

// The phases of a rollout.
const (
	RolloutPending     RolloutPhase = "Pending"
	RolloutPreflight   RolloutPhase = "Preflight"
	RolloutPlanned     RolloutPhase = "Planned" // spec.rollout.dryRun is set; status.plan says what would happen
	RolloutProgressing RolloutPhase = "Progressing"
	RolloutPaused      RolloutPhase = "Paused"
	RolloutCompleted   RolloutPhase = "Completed"
	RolloutRollingBack RolloutPhase = "RollingBack"
	RolloutFailed      RolloutPhase = "Failed"
)

// Condition types of a ProxyConfig.
const (
	// ConditionReady is true when every selected node runs the target mode.
	ConditionReady = "Ready"
	// ConditionProgressing is true while nodes are being moved.
	ConditionProgressing = "Progressing"
	// ConditionDegraded is true when a node failed or a conflict blocks nodes.
	ConditionDegraded = "Degraded"
)

// MaxFailedNodes bounds status.failedNodes so status stays small on big
// clusters; the counts stay exact.
const MaxFailedNodes = 20

// Bounds of status.plan, so status stays small on big clusters; the
// counts stay exact.
const (
	// MaxPlanBatches bounds status.plan.batches.
	MaxPlanBatches = 50
	// MaxPlanNodeNames bounds the node names listed over all batches.
	MaxPlanNodeNames = 200
	// MaxPlanProblems bounds status.plan.preflight.problems.
	MaxPlanProblems = 20
)

// RolloutPlan is what a rollout would do, published while
// spec.rollout.dryRun is set: the nodes it would move, in the order and
// the batches the rollout moves them in.
type RolloutPlan struct {
	// Mode is the mode the plan moves the nodes to.
	Mode ProxyMode `json:"mode"`
	// MaxUnavailable is spec.rollout.maxUnavailable resolved for the
	// selected nodes.
	MaxUnavailable int32 `json:"maxUnavailable"`
	// Nodes is how many nodes the plan moves.
	Nodes int32 `json:"nodes"`
	// BatchCount is how many batches the plan has (batches lists at most 50).
	BatchCount int32 `json:"batchCount"`
	// Batches are the batches in the order they start, the canary first.
	// A batch starts when the one before it settled; at most
	// maxUnavailable nodes are in transition at once.
	// +optional
	// +kubebuilder:validation:MaxItems=50
	Batches []PlanBatch `json:"batches,omitempty"`
	// Preflight is the outcome of the preflight checks of the nodes that
	// do not run the mode yet.
	Preflight PlanPreflight `json:"preflight"`
}

// PlanBatch is a set of nodes that start together.
type PlanBatch struct {
	// Canary marks the canary batch.
	// +optional
	Canary bool `json:"canary,omitempty"`
	// Count is how many nodes the batch has.
	Count int32 `json:"count"`
	// Nodes names them, in order (cut when the plan names 200 nodes).
	// +optional
	// +kubebuilder:validation:MaxItems=200
	Nodes []string `json:"nodes,omitempty"`
}

// PlanPreflight counts the preflight outcomes and names the nodes that
// did not pass.
type PlanPreflight struct {
	// Passed is how many nodes can run the mode.
	Passed int32 `json:"passed"`
	// Blocked is how many nodes cannot run it (or did not report in time).
	Blocked int32 `json:"blocked"`
	// Waiting is how many nodes have not reported their kernel facts yet.
	Waiting int32 `json:"waiting"`
	// Problems names the blocked and waiting nodes, with why (at most 20).
	// +optional
	// +kubebuilder:validation:MaxItems=20
	Problems []PlanProblem `json:"problems,omitempty"`
}

// PlanProblem is a node that did not pass preflight.
type PlanProblem struct {
	// Name is the node's name.
	Name string `json:"name"`
	// Outcome is Blocked or Waiting.
	Outcome PreflightOutcome `json:"outcome"`
	// Reason says why, in words a person can act on.
	// +optional
	Reason string `json:"reason,omitempty"`
}

// PreflightOutcome is how a node did in preflight.
// +kubebuilder:validation:Enum=Blocked;Waiting
type PreflightOutcome string

// The preflight outcomes of nodes that did not pass.
const (
	PreflightBlocked PreflightOutcome = "Blocked"
	PreflightWaiting PreflightOutcome = "Waiting"
)

// MaxFindings bounds status.findings; MaxFindingObjects bounds the objects
// each finding names (its count stays exact).
const (
	MaxFindings       = 32
	MaxFindingObjects = 10
)

// FindingSeverity says how much a finding matters.
// +kubebuilder:validation:Enum=Info;Warning;Critical
type FindingSeverity string

// The severities of a finding.
const (
	// SeverityInfo: behaviour differs in a way that rarely matters.
	SeverityInfo FindingSeverity = "Info"
	// SeverityWarning: something may stop working, depending on how the
	// cluster is used.
	SeverityWarning FindingSeverity = "Warning"
	// SeverityCritical: something that works now stops working on the
	// moved nodes; the rollout holds until the code is acknowledged.
	SeverityCritical FindingSeverity = "Critical"
)

// Finding is one way the selected nodes will behave differently in the
// target mode from what serves them now, found from the cluster's
// Services and the nodes' reports before they move.
type Finding struct {
	// Code names the finding; it is stable and is what
	// spec.rollout.acknowledgedFindings lists.
	// +kubebuilder:validation:MaxLength=64
	Code string `json:"code"`
	// Severity is Info, Warning or Critical.
	Severity FindingSeverity `json:"severity"`
	// Message says what will behave differently, and where.
	// +kubebuilder:validation:MaxLength=1024
	Message string `json:"message"`
	// Objects are the first objects affected ("namespace/name" for
	// Services, "node/<name>" for nodes), sorted.
	// +optional
	// +kubebuilder:validation:MaxItems=10
	// +kubebuilder:validation:items:MaxLength=320
	Objects []string `json:"objects,omitempty"`
	// Count is how many objects are affected in all.
	Count int32 `json:"count"`
	// Action says what to do about it.
	// +kubebuilder:validation:MaxLength=1024
	Action string `json:"action"`
}

// NodeCounts are the rollout's node counts.
type NodeCounts struct {
	// Selected is how many nodes the selector matches.
	Selected int32 `json:"selected"`
	// Updated is how many selected nodes run the target mode.
	Updated int32 `json:"updated"`
	// Ready is how many selected nodes are Active and healthy in any mode.
	Ready int32 `json:"ready"`
	// Failed is how many selected nodes failed to switch.
	Failed int32 `json:"failed"`
	// Summary is "updated/selected", as kubectl shows it.
	// +optional
	Summary string `json:"summary,omitempty"`
}

// FailedNode names a node that failed and why.
type FailedNode struct {
	// Name is the node's name.
	Name string `json:"name"`
	// Reason says what failed, in words a person can act on.
	Reason string `json:"reason"`
}

// ProxyConfigStatus is the progress of the rollout.
type ProxyConfigStatus struct {
	// ObservedGeneration is the generation this status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// Phase is where the rollout stands.
	// +optional
	Phase RolloutPhase `json:"phase,omitempty"`

	// TargetMode is the mode nodes are being moved to.
	// +optional
	TargetMode ProxyMode `json:"targetMode,omitempty"`

	// Selector is the node selector in label-selector text form.
	// +optional
	Selector string `json:"selector,omitempty"`

	// Nodes are the node counts.
	// +optional
	Nodes NodeCounts `json:"nodes,omitempty"`

	// Conditions are Ready, Progressing and Degraded.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// FailedNodes lists failed nodes with their reasons (at most 20).
	// +optional
	// +kubebuilder:validation:MaxItems=20
	FailedNodes []FailedNode `json:"failedNodes,omitempty"`

	// StartTime is when the current rollout started.
	// +optional
	StartTime *metav1.Time `json:"startTime,omitempty"`

	// CanaryPassedTime is when the current rollout's canary passed: the
	// canary pause (spec.rollout.canary.pause) counts from it, whatever
	// was paused before.
	// +optional
	CanaryPassedTime *metav1.Time `json:"canaryPassedTime,omitempty"`

	// CompletionTime is when the current rollout completed.
	// +optional
	CompletionTime *metav1.Time `json:"completionTime,omitempty"`

	// Plan is what the rollout would do, while spec.rollout.dryRun is set.
	// +optional
	Plan *RolloutPlan `json:"plan,omitempty"`
	// Findings are what will behave differently on the selected nodes
	// that still have to move, compared with what serves them now, most
	// severe first (docs/behaviour-differences.md lists every code).
	// +optional
	// +listType=map
	// +listMapKey=code
	// +kubebuilder:validation:MaxItems=32
	Findings []Finding `json:"findings,omitempty"`

	// KubeProxyBridge is the progress of a change of kube-proxy's own
	// mode (spec.kubeProxy).
	// +optional
	KubeProxyBridge *KubeProxyBridgeStatus `json:"kubeProxyBridge,omitempty"`
}

// ProxyConfig is the desired service-proxy mode of a set of nodes, and the
// policy for moving them to it safely.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=pxc,categories=proxyshift
// +kubebuilder:printcolumn:name="Mode",type=string,JSONPath=`.spec.mode`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Updated",type=string,JSONPath=`.status.nodes.summary`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:printcolumn:name="Target",type=string,JSONPath=`.status.targetMode`,priority=1
// +kubebuilder:printcolumn:name="Failed",type=integer,JSONPath=`.status.nodes.failed`,priority=1
// +kubebuilder:printcolumn:name="Selector",type=string,JSONPath=`.status.selector`,priority=1
// +kubebuilder:printcolumn:name="Bridge",type=string,JSONPath=`.status.kubeProxyBridge.stage`,priority=1
type ProxyConfig struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec   ProxyConfigSpec   `json:"spec"`
	Status ProxyConfigStatus `json:"status,omitempty"`
}

// ProxyConfigList is a list of ProxyConfigs.
// +kubebuilder:object:root=true
type ProxyConfigList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ProxyConfig `json:"items"`
}

func init() {
	SchemeBuilder.Register(&ProxyConfig{}, &ProxyConfigList{})
}
