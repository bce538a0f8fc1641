package findings

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
)

// Input is what the findings are computed from. Compute never modifies it.
type Input struct {
	// Target is the ProxyConfig's mode, Settings its settings.
	Target   v1alpha1.ProxyMode
	Settings *v1alpha1.ProxySettings
	// Nodes are the ProxyNodes of the nodes about to move. A node whose
	// status says nothing serves it yet adds nothing: nothing changes for
	// it.
	Nodes []*v1alpha1.ProxyNode
	// Services are the cluster's Services (Trim keeps what is read).
	Services []*corev1.Service
}

// Proxy is what serves a node: kube-proxy (in its mode, empty when not
// known) or a proxyshift mode.
type Proxy struct {
	KubeProxy bool
	Mode      v1alpha1.ProxyMode
}

// String names the proxy as a message does.
func (p Proxy) String() string {
	switch {
	case p.KubeProxy && p.Mode == "":
		return "kube-proxy"
	case p.KubeProxy:
		return fmt.Sprintf("kube-proxy (%s)", p.Mode)
	}
	return fmt.Sprintf("proxyshift %s", p.Mode)
}

// same says whether p and q are the same proxy; kube-proxy is one proxy,
// whatever its mode is known to be.
func (p Proxy) same(q Proxy) bool {
	return p.KubeProxy == q.KubeProxy && (p.KubeProxy || p.Mode == q.Mode)
}

// serving is what serves a node by its ProxyNode's status; false when
// nothing does.
func serving(pn *v1alpha1.ProxyNode) (Proxy, bool) {
	switch m := pn.Status.ActiveMode; m {
	case v1alpha1.ModeKubeProxy:
		return Proxy{KubeProxy: true, Mode: pn.Status.KubeProxyMode}, true
	case v1alpha1.ModeIPTables, v1alpha1.ModeNFTables, v1alpha1.ModeIPVS:
		return Proxy{Mode: m}, true
	}
	return Proxy{}, false
}

// targetOf is the proxy a ProxyConfig's mode moves nodes to. Handing
// nodes back to kube-proxy moves them to whatever mode its ConfigMap
// says, which the operator does not know.
func targetOf(mode v1alpha1.ProxyMode) Proxy {
	if mode == v1alpha1.ModeKubeProxy {
		return Proxy{KubeProxy: true}
	}
	return Proxy{Mode: mode}
}

// Compute returns the findings for moving in.Nodes to in.Target, most
// severe first, then by code; at most v1alpha1.MaxFindings.
func Compute(in Input) []v1alpha1.Finding {
	to := targetOf(in.Target)
	settings := in.Settings
	if settings == nil {
		settings = &v1alpha1.ProxySettings{}
	}
	var out []v1alpha1.Finding
	for _, r := range rules {
		var nodes []string
		froms := map[Proxy]bool{}
		for _, pn := range in.Nodes {
			from, ok := serving(pn)
			if ok && !from.same(to) && r.applies(from, to, settings) {
				nodes = append(nodes, "node/"+pn.Name)
				froms[from] = true
			}
		}
		if len(nodes) == 0 {
			continue
		}
		objects := nodes
		if r.service != nil {
			objects = nil
			for _, svc := range in.Services {
				if served(svc) && r.service(svc) {
					objects = append(objects, svc.Namespace+"/"+svc.Name)
				}
			}
			if len(objects) == 0 {
				continue
			}
		}
		sort.Strings(objects)
		where := fmt.Sprintf("%s now served by %s", plural(len(nodes), "node"), names(froms))
		if r.service != nil {
			where = plural(len(objects), "Service") + " on " + where
		}
		out = append(out, v1alpha1.Finding{
			Code:     r.code,
			Severity: r.severity,
			Message:  fmt.Sprintf(r.message, to) + " (" + where + ")",
			Objects:  objects[:min(len(objects), v1alpha1.MaxFindingObjects)],
			Count:    int32(len(objects)),
			Action:   r.action,
		})
	}
	sort.SliceStable(out, func(i, j int) bool {
		if a, b := rank[out[i].Severity], rank[out[j].Severity]; a != b {
			return a > b
		}
		return out[i].Code < out[j].Code
	})
	return out[:min(len(out), v1alpha1.MaxFindings)]
}

var rank = map[v1alpha1.FindingSeverity]int{v1alpha1.SeverityInfo: 0, v1alpha1.SeverityWarning: 1, v1alpha1.SeverityCritical: 2}

// Unacknowledged returns the Critical findings whose codes acked does not
// list: those that hold a rollout.
func Unacknowledged(fs []v1alpha1.Finding, acked []string) []v1alpha1.Finding {
	var out []v1alpha1.Finding
	for _, f := range fs {
		if f.Severity == v1alpha1.SeverityCritical && !slices.Contains(acked, f.Code) {
			out = append(out, f)
		}
	}
	return out
}

// names lists the proxies, sorted.
func names(ps map[Proxy]bool) string {
	var out []string
	for p := range ps {
		out = append(out, p.String())
	}
	sort.Strings(out)
	return strings.Join(out, ", ")
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}
