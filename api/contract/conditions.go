package contract

import (
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
)

// The condition types an agent writes on its ProxyNode's status, and the
// operator reads (Healthy).
const (
	// ConditionReady is True when the desired mode serves and its last
	// sync succeeded.
	ConditionReady = "Ready"
	// ConditionDegraded is True when a switch failed or something is
	// wrong although the node serves (a failed sync, kube-proxy's
	// leftovers that could not be removed).
	ConditionDegraded = "Degraded"
)

// The reasons of the ProxyNode conditions. Each says what a person can
// do about it; the message has the specifics.
const (
	// ReasonActive: the desired mode serves and its last sync succeeded.
	ReasonActive = "Active"
	// ReasonSwitching: a switch is in progress; wait.
	ReasonSwitching = "Switching"
	// ReasonForeignObjects: the last sync programmed everything but what
	// another program holds where the mode wants its own objects (an IPVS
	// virtual service), which it left alone; remove that program's
	// object, or the Service, to resolve it.
	ReasonForeignObjects = "ForeignObjects"
	// ReasonFamilyMissing: the last sync programmed the IP family the
	// node carries and none of the Services' ports of a family it lacks
	// (IPv6 turned off by sysctl or at boot); turn that family on, or
	// make those Services single-stack, to resolve it.
	ReasonFamilyMissing = "FamilyMissing"
	// ReasonSyncFailed: the last sync failed; the kernel keeps the last
	// good rules. The message has the kernel's error.
	ReasonSyncFailed = "SyncFailed"
	// ReasonNoMode: no mode is desired and none is programmed.
	ReasonNoMode = "NoModeDesired"
	// ReasonNotSynced: the agent's informers have not synced (the API
	// server is unreachable, or denies the agent its lists); the kernel
	// keeps the rules it holds until they do.
	ReasonNotSynced = "InformersNotSynced"
	// ReasonSettingsUnresolved: the spec's settings do not resolve on
	// this node (nodePortAddresses: primary and the Node has no InternalIP
	// yet, say); the agent keeps the rules it runs with until they do.
	ReasonSettingsUnresolved = "SettingsUnresolved"
	// ReasonAsExpected: nothing is wrong.
	ReasonAsExpected = "AsExpected"

	// The reasons a switch fails in its Preparing phase, when the kernel
	// cannot run the mode (fail closed: the node keeps its mode).

	// ReasonModuleMissing: a module the mode needs is not on the node.
	ReasonModuleMissing = "ModuleMissing"
	// ReasonModuleUnknown: a module's state could not be told and the
	// mode's capability probe failed.
	ReasonModuleUnknown = "ModuleUnknown"
	// ReasonModuleLoadFailed: a module the mode needs did not load.
	ReasonModuleLoadFailed = "ModuleLoadFailed"
	// ReasonCapabilityMissing: the kernel does not do what the mode needs.
	ReasonCapabilityMissing = "CapabilityMissing"
	// ReasonUnsupportedMode: the agent has no such mode (or scheduler).
	ReasonUnsupportedMode = "UnsupportedMode"

	// The reasons a switch fails in its later phases.

	// ReasonProgrammingFailed: the new mode could not be programmed.
	ReasonProgrammingFailed = "ProgrammingFailed"
	// ReasonVerificationFailed: the new mode did not pass its checks.
	ReasonVerificationFailed = "VerificationFailed"
	// ReasonCleanupFailed: the old mode could not be removed.
	ReasonCleanupFailed = "CleanupFailed"
	// ReasonKubeProxyLeftovers: kube-proxy's leftovers could not be
	// removed after a takeover (Degraded while the node serves).
	ReasonKubeProxyLeftovers = "KubeProxyCleanupFailed"
	// ReasonKubeProxyUnknown: the agent was asked to hand its node back
	// to kube-proxy but does not look for kube-proxy on the node.
	ReasonKubeProxyUnknown = "KubeProxyUnknown"
)

// Healthy applies the node health rule the operator reads an agent's
// conditions with: unhealthy when condition Ready is False or condition
// Degraded is True; a condition that is absent says nothing. The reason
// quotes the condition.
func Healthy(st *v1alpha1.ProxyNodeStatus) (bool, string) {
	for _, c := range st.Conditions {
		switch {
		case c.Type == ConditionReady && c.Status == metav1.ConditionFalse,
			c.Type == ConditionDegraded && c.Status == metav1.ConditionTrue:
			return false, ConditionText(c)
		}
	}
	return true, ""
}

// ConditionText describes a condition in one line: type, status, reason
// and message.
func ConditionText(c metav1.Condition) string {
	s := fmt.Sprintf("condition %s is %s", c.Type, c.Status)
	if c.Reason != "" {
		s += " (" + c.Reason + ")"
	}
	if c.Message != "" {
		s += ": " + c.Message
	}
	return s
}
