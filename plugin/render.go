// Package plugin implements `kubectl proxyshift`, the kubectl plugin that
// shows where a rollout stands and steers it.
//
// Why a plugin: `kubectl get proxyconfig,proxynodes` shows one object per
// line, but the question a user asks during a migration is "where is each
// node of this rollout, and who serves it?", which joins a ProxyConfig
// with the ProxyNodes it moves. The plugin renders that picture (the same
// one the demo prints), and turns pause and resume into one command each
// instead of a hand-written patch. `plan` shows a dry run's plan (and asks
// for one); `rollback` sets the spec back to the mode the rollout's nodes
// ran before, so the operator's normal rollout moves them back. Rendering
// is pure (render.go and RenderPlan, tested with golden text); the commands
// (commands.go, plan.go, rollback.go) only read and write through the API
// server.
package plugin

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/util/duration"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
)

// none is what a table shows for an empty field, as kubectl does.
const none = "<none>"

// RenderStatus writes the rollout of each config: one line for the
// config, then one line per node it has asked for a mode (its ProxyNodes'
// spec.configRef), with the node's desired and active mode, switch phase
// and, when it is not healthy, why.
func RenderStatus(w io.Writer, cfgs []v1alpha1.ProxyConfig, pns []v1alpha1.ProxyNode, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	sort.Slice(cfgs, func(i, j int) bool { return cfgs[i].Name < cfgs[j].Name })
	for i, c := range cfgs {
		if i > 0 {
			fmt.Fprintln(tw)
		}
		st := c.Status
		fmt.Fprintf(tw, "PROXYCONFIG\tMODE\tPHASE\tUPDATED\tFAILED\tPAUSED\tSELECTOR\tAGE\n")
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%v\t%s\t%s\n", c.Name, c.Spec.Mode, orNone(string(st.Phase)), orNone(st.Nodes.Summary),
			st.Nodes.Failed, c.Spec.Rollout.Paused, orNone(st.Selector), age(c.CreationTimestamp.Time, now))
		if b := st.KubeProxyBridge; b != nil {
			back := ""
			if b.RollingBack {
				back = ", rolling back: " + b.Failure
			}
			fmt.Fprintf(tw, "  kube-proxy %s -> %s, bridged by proxyshift %s: stage %s (ConfigMap %s)%s\n", b.From, b.To, b.Bridge, b.Stage, b.ConfigMap, back)
		}
		if cond := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionReady); cond != nil && cond.Message != "" {
			fmt.Fprintf(tw, "  %s: %s\n", cond.Reason, cond.Message)
		}
		for _, f := range st.FailedNodes {
			fmt.Fprintf(tw, "  failed %s: %s\n", f.Name, f.Reason)
		}
		rows := nodesOf(c.Name, pns)
		if len(rows) == 0 {
			fmt.Fprintf(tw, "  (no node asked yet)\n")
			continue
		}
		fmt.Fprintf(tw, "  NODE\tDESIRED\tACTIVE\tPHASE\tCONDITION\n")
		for _, pn := range rows {
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\n", pn.Name, orNone(string(pn.Spec.DesiredMode)), orNone(string(pn.Status.ActiveMode)),
				orNone(string(pn.Status.Phase)), unhealthy(pn))
		}
	}
	return tw.Flush()
}

// RenderNodes writes one line per ProxyNode: who serves the node
// (proxyshift in a mode, or kube-proxy), the mode of the kube-proxy rules
// its kernel holds, what it is asked for, and the last sync's figures.
func RenderNodes(w io.Writer, pns []v1alpha1.ProxyNode, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	sort.Slice(pns, func(i, j int) bool { return pns[i].Name < pns[j].Name })
	fmt.Fprintf(tw, "NODE\tSERVED-BY\tKUBE-PROXY\tDESIRED\tCONFIG\tPHASE\tSERVICES\tRULES\tLAST-SYNC\tCONDITION\n")
	for _, pn := range pns {
		st := pn.Status
		served := none
		switch st.ActiveMode {
		case "":
		case v1alpha1.ModeKubeProxy:
			served = string(st.ActiveMode)
		default:
			served = "proxyshift/" + string(st.ActiveMode)
		}
		cfg := none
		if r := pn.Spec.ConfigRef; r != nil {
			cfg = fmt.Sprintf("%s/%d", r.Name, r.Generation)
		}
		services, rules, synced := none, none, none
		if st.Counts != nil {
			services, rules = fmt.Sprint(st.Counts.Services), fmt.Sprint(st.Counts.Rules)
		}
		if st.LastSyncTime != nil {
			synced = age(st.LastSyncTime.Time, now)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", pn.Name, served, orNone(string(st.KubeProxyMode)), orNone(string(pn.Spec.DesiredMode)), cfg,
			orNone(string(st.Phase)), services, rules, synced, unhealthy(pn))
	}
	return tw.Flush()
}

// nodesOf returns the ProxyNodes the named config has asked for a mode,
// by name.
func nodesOf(config string, pns []v1alpha1.ProxyNode) []v1alpha1.ProxyNode {
	var out []v1alpha1.ProxyNode
	for _, pn := range pns {
		if pn.Spec.ConfigRef != nil && pn.Spec.ConfigRef.Name == config {
			out = append(out, pn)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// unhealthy names the first of the node's conditions that is not as it
// should be (Ready false, Degraded true), with its reason; "-" when none.
func unhealthy(pn v1alpha1.ProxyNode) string {
	for _, c := range pn.Status.Conditions {
		bad := (c.Type == v1alpha1.ConditionReady && c.Status != "True") || (c.Type == v1alpha1.ConditionDegraded && c.Status == "True")
		if bad {
			msg := c.Type + "=" + string(c.Status) + " " + c.Reason
			if c.Message != "" {
				msg += ": " + firstLine(c.Message)
			}
			return msg
		}
	}
	return "-"
}

// age is how long ago t was, as kubectl prints ages.
func age(t, now time.Time) string {
	if t.IsZero() {
		return none
	}
	return duration.HumanDuration(now.Sub(t))
}

func orNone(s string) string {
	if s == "" {
		return none
	}
	return s
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	return s
}
