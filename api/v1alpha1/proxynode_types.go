package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ConfigReference names the ProxyConfig, and the generation of it, that a
// ProxyNode's desired state comes from.
type ConfigReference struct {
	// Name is the ProxyConfig's name.
	Name string `json:"name"`
	// Generation is the ProxyConfig's metadata.generation.
	Generation int64 `json:"generation"`
	// Step tells apart the specs one generation writes in turn: the
	// stages of a change of kube-proxy's own mode (TakingOver,
	// HandingBack, and RollingBack/... for its rollback). Empty otherwise.
	// +optional
	Step string `json:"step,omitempty"`
}

// ProxyNodeSpec is what the operator wants this node to run. Only the
// operator writes it.
type ProxyNodeSpec struct {
	// DesiredMode is the dataplane the node should run.
	// +optional
	DesiredMode ProxyMode `json:"desiredMode,omitempty"`

	// ConfigRef is the ProxyConfig generation this desire comes from.
	// +optional
	ConfigRef *ConfigReference `json:"configRef,omitempty"`

	// Settings are the dataplane settings to run the mode with.
	// +optional
	Settings ProxySettings `json:"settings,omitempty"`

	// KubeProxyStopped is the operator's word that kube-proxy no longer
	// runs on this node: the node carries the label kube-proxy's
	// DaemonSet excludes and no kube-proxy pod is left on it. Only then
	// does the agent, taking the node over, remove kube-proxy's leftovers.
	// +optional
	KubeProxyStopped bool `json:"kubeProxyStopped,omitempty"`
}

// NodePhase is where a node stands in a mode switch.
// +kubebuilder:validation:Enum=Idle;Preparing;Programming;Verifying;WaitingForKubeProxy;CleaningUp;Active;Failed
type NodePhase string

// The phases of a node, in the order a switch walks them.
const (
	NodeIdle        NodePhase = "Idle"
	NodePreparing   NodePhase = "Preparing"
	NodeProgramming NodePhase = "Programming"
	NodeVerifying   NodePhase = "Verifying"
	// NodeWaitingForKubeProxy: taking the node over, the new mode is
	// programmed and verified and waits for kube-proxy's pod to leave
	// before removing its leftovers; handing the node back, proxyshift
	// keeps serving until kube-proxy's pod is back and has synced.
	NodeWaitingForKubeProxy NodePhase = "WaitingForKubeProxy"
	NodeCleaningUp          NodePhase = "CleaningUp"
	NodeActive              NodePhase = "Active"
	NodeFailed              NodePhase = "Failed"
)

// ModuleState is what the kernel says of a module.
// +kubebuilder:validation:Enum=Loaded;BuiltIn;Loadable;Missing;Unknown
type ModuleState string

// The states of a kernel module. Unknown means the agent could not tell;
// it never guesses.
const (
	ModuleLoaded   ModuleState = "Loaded"
	ModuleBuiltIn  ModuleState = "BuiltIn"
	ModuleLoadable ModuleState = "Loadable"
	ModuleMissing  ModuleState = "Missing"
	ModuleUnknown  ModuleState = "Unknown"
)

// Capability is a tri-state answer to "does this work here?".
// +kubebuilder:validation:Enum=Yes;No;Unknown
type Capability string

// The answers a capability probe can give.
const (
	CapabilityYes     Capability = "Yes"
	CapabilityNo      Capability = "No"
	CapabilityUnknown Capability = "Unknown"
)

// KernelModule is one kernel module and its state.
type KernelModule struct {
	// Name is the module's name, such as ip_vs.
	Name string `json:"name"`
	// State is Loaded, BuiltIn, Loadable, Missing or Unknown.
	State ModuleState `json:"state"`
}

// IPTablesBackend is one of the two iptables backends (legacy, nft).
type IPTablesBackend struct {
	// Name is legacy or nft.
	// +kubebuilder:validation:Enum=legacy;nft
	Name string `json:"name"`
	// Available says whether the backend's tools work on this node.
	Available Capability `json:"available"`
	// HasRules says whether the backend holds any rules.
	HasRules Capability `json:"hasRules"`
}

// KernelSetting is one kernel setting (sysctl) of the node that the
// serving mode sets.
type KernelSetting struct {
	// Name is the sysctl's name, e.g. net.ipv4.vs.conntrack.
	Name string `json:"name"`
	// Want is the value the serving mode sets.
	Want string `json:"want"`
	// Value is the value the kernel holds; empty when it could not be read
	// (the setting does not exist yet, e.g. before ip_vs is loaded).
	// +optional
	Value string `json:"value,omitempty"`
}

// KernelFacts are what the agent found out about the node's kernel.
type KernelFacts struct {
	// Version is the kernel release (uname -r).
	// +optional
	Version string `json:"version,omitempty"`
	// Modules are the modules the modes need, with their states.
	// +optional
	// +listType=map
	// +listMapKey=name
	Modules []KernelModule `json:"modules,omitempty"`
	// NFTables says whether nf_tables answers over netlink.
	// +optional
	NFTables Capability `json:"nftables,omitempty"`
	// IPTablesBackends are the iptables backends and whether they hold rules.
	// +optional
	// +listType=map
	// +listMapKey=name
	IPTablesBackends []IPTablesBackend `json:"iptablesBackends,omitempty"`
	// Settings are the sysctls the serving mode sets (IPVS: conntrack,
	// conn_reuse_mode, expire_nodest_conn, strictARP's
	// arp_ignore/arp_announce...), with the value wanted and the value the
	// kernel holds.
	// +optional
	// +listType=map
	// +listMapKey=name
	Settings []KernelSetting `json:"settings,omitempty"`
	// ReportedTime is when the facts were gathered.
	// +optional
	ReportedTime *metav1.Time `json:"reportedTime,omitempty"`
}

// RuleCounts are the sizes of what the dataplane programmed.
type RuleCounts struct {
	// Services is how many service ports are programmed.
	Services int32 `json:"services"`
	// Endpoints is how many endpoints are programmed.
	Endpoints int32 `json:"endpoints"`
	// Rules is how many rules, map elements or virtual servers the
	// dataplane holds.
	Rules int32 `json:"rules"`
}

// ProxyNodeStatus is what the agent reports. Only the agent writes it.
type ProxyNodeStatus struct {
	// ActiveMode is what serves traffic now: a proxyshift mode, or
	// kube-proxy when only kube-proxy's rules are in the kernel.
	// +optional
	ActiveMode ProxyMode `json:"activeMode,omitempty"`

	// ActiveSettings are the settings (a spec.settings) activeMode runs
	// with: those it was last built with, kept when a later change of
	// them fails and is rolled back. A restarted agent builds the mode
	// from them while that failure is held, so settings that failed
	// verification are never programmed unverified. Absent when no mode
	// of proxyshift's serves.
	// +optional
	ActiveSettings *ProxySettings `json:"activeSettings,omitempty"`

	// KubeProxyMode is the mode of the kube-proxy objects the kernel
	// holds (iptables, nftables or ipvs), whether kube-proxy runs or left
	// them behind; empty when there are none.
	// +optional
	KubeProxyMode ProxyMode `json:"kubeProxyMode,omitempty"`

	// Phase is where the node stands in a switch.
	// +optional
	Phase NodePhase `json:"phase,omitempty"`

	// ObservedConfig is the config generation the agent last acted on.
	// +optional
	ObservedConfig *ConfigReference `json:"observedConfig,omitempty"`

	// Kernel are the node's kernel facts.
	// +optional
	Kernel *KernelFacts `json:"kernel,omitempty"`

	// LastSyncTime is when rules were last synced.
	// +optional
	LastSyncTime *metav1.Time `json:"lastSyncTime,omitempty"`

	// LastSyncDuration is how long the last sync took.
	// +optional
	LastSyncDuration *metav1.Duration `json:"lastSyncDuration,omitempty"`

	// Counts are the sizes of the programmed dataplane.
	// +optional
	Counts *RuleCounts `json:"counts,omitempty"`

	// Conditions describe the node's health.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// ProxyNode is one node's desired and actual service-proxy state, named
// after the node.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=pn,categories=proxyshift
// +kubebuilder:printcolumn:name="Desired",type=string,JSONPath=`.spec.desiredMode`
// +kubebuilder:printcolumn:name="Active",type=string,JSONPath=`.status.activeMode`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Kube-Proxy",type=string,JSONPath=`.status.kubeProxyMode`
// +kubebuilder:printcolumn:name="Rules",type=integer,JSONPath=`.status.counts.rules`
// +kubebuilder:printcolumn:name="Last-Sync",type=date,JSONPath=`.status.lastSyncTime`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type ProxyNode struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   ProxyNodeSpec   `json:"spec,omitempty"`
	Status ProxyNodeStatus `json:"status,omitempty"`
}

// ProxyNodeList is a list of ProxyNodes.
// +kubebuilder:object:root=true
type ProxyNodeList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ProxyNode `json:"items"`
}

func init() {
	SchemeBuilder.Register(&ProxyNode{}, &ProxyNodeList{})
}
