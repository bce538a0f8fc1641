package handover

import (
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
)

const dsName = "kube-system/kube-proxy"

func daemonSet() *appsv1.DaemonSet {
	return &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "kube-proxy", Generation: 1},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"k8s-app": "kube-proxy"}},
		},
		Status: appsv1.DaemonSetStatus{ObservedGeneration: 1, DesiredNumberScheduled: 3, UpdatedNumberScheduled: 3},
	}
}

func withAffinity() *appsv1.DaemonSet {
	ds := daemonSet()
	addAffinity(ds)
	return ds
}

func proxyNode(name string, desired, active v1alpha1.ProxyMode, phase v1alpha1.NodePhase) *v1alpha1.ProxyNode {
	return &v1alpha1.ProxyNode{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       v1alpha1.ProxyNodeSpec{DesiredMode: desired},
		Status:     v1alpha1.ProxyNodeStatus{ActiveMode: active, Phase: phase},
	}
}

func kubeProxyPod(node string) Pod {
	return Pod{Labels: map[string]string{"k8s-app": "kube-proxy"}, Node: node}
}

func TestWant(t *testing.T) {
	const (
		nft = v1alpha1.ModeNFTables
		kp  = v1alpha1.ModeKubeProxy
	)
	for _, tc := range []struct {
		desired, active v1alpha1.ProxyMode
		phase           v1alpha1.NodePhase
		want            Need
	}{
		{nft, kp, v1alpha1.NodeWaitingForKubeProxy, Off},
		{nft, nft, v1alpha1.NodeCleaningUp, Off},
		{nft, v1alpha1.ModeIPTables, v1alpha1.NodeActive, Off},
		{nft, kp, v1alpha1.NodeProgramming, Keep}, // kube-proxy still serves; not yet
		{nft, "", v1alpha1.NodePreparing, Keep},
		{nft, kp, v1alpha1.NodeFailed, Keep},
		{kp, nft, v1alpha1.NodeWaitingForKubeProxy, On},
		{kp, kp, v1alpha1.NodeActive, On},
		{"", nft, v1alpha1.NodeActive, Off}, // its ProxyConfig was deleted: it keeps proxyshift
		{"", kp, v1alpha1.NodeActive, On},
		{"", "", v1alpha1.NodeIdle, Keep},
		{"", "", "", Keep},
	} {
		if got := Want(proxyNode("n", tc.desired, tc.active, tc.phase)); got != tc.want {
			t.Errorf("desired %q active %q phase %q: %v, want %v", tc.desired, tc.active, tc.phase, got, tc.want)
		}
	}
}

// world is a Plan input under test.
type world struct {
	in Input
}

func newWorld(ds *appsv1.DaemonSet, pns ...*v1alpha1.ProxyNode) *world {
	w := &world{in: Input{DaemonSetName: dsName, DaemonSet: ds, Labelled: map[string]bool{}, Nodes: map[string]bool{},
		ProxyNodes: map[string]*v1alpha1.ProxyNode{}}}
	for _, pn := range pns {
		w.in.ProxyNodes[pn.Name] = pn
		w.in.Nodes[pn.Name] = true
		w.in.Pods = append(w.in.Pods, kubeProxyPod(pn.Name))
	}
	return w
}

func stoppedOf(res Result) map[string]bool {
	out := map[string]bool{}
	for _, pn := range res.ProxyNodes {
		out[pn.Name] = pn.Spec.KubeProxyStopped
	}
	return out
}

func reasons(res Result) []string {
	var out []string
	for _, e := range res.Events {
		out = append(out, e.Reason)
	}
	return out
}

func TestPlan(t *testing.T) {
	waiting := func(name string) *v1alpha1.ProxyNode {
		return proxyNode(name, v1alpha1.ModeNFTables, v1alpha1.ModeKubeProxy, v1alpha1.NodeWaitingForKubeProxy)
	}
	handBack := func(name string) *v1alpha1.ProxyNode {
		return proxyNode(name, v1alpha1.ModeKubeProxy, v1alpha1.ModeNFTables, v1alpha1.NodeWaitingForKubeProxy)
	}
	for name, tc := range map[string]struct {
		w           *world
		mut         func(*world)
		dsChange    string // "", "add", "remove", "restore"
		label       []string
		unlabel     []string
		stopped     map[string]bool
		events      []string
		conflicts   []string
		eventSubstr string
	}{
		"affinity first, no label yet": {
			w:        newWorld(daemonSet(), waiting("a"), proxyNode("b", "", v1alpha1.ModeKubeProxy, v1alpha1.NodeActive)),
			dsChange: "add", events: []string{EventAffinityAdded},
		},
		"then the label": {
			w:     newWorld(withAffinity(), waiting("a"), proxyNode("b", "", v1alpha1.ModeKubeProxy, v1alpha1.NodeActive)),
			label: []string{"a"}, events: []string{EventStopping},
		},
		"labelled, pod still there (terminating counts)": {
			w:   newWorld(withAffinity(), waiting("a")),
			mut: func(w *world) { w.in.Labelled["a"] = true },
		},
		"labelled, pod gone: stopped": {
			w: newWorld(withAffinity(), waiting("a"), waiting("b")),
			mut: func(w *world) {
				w.in.Labelled["a"], w.in.Labelled["b"], w.in.Pods = true, true, []Pod{kubeProxyPod("b")}
			},
			stopped: map[string]bool{"a": true}, events: []string{EventStopped},
		},
		"pods of other apps do not count": {
			w: newWorld(withAffinity(), waiting("a")),
			mut: func(w *world) {
				w.in.Labelled["a"], w.in.Pods = true, []Pod{{Labels: map[string]string{"k8s-app": "coredns"}, Node: "a"}, {Labels: map[string]string{"k8s-app": "kube-proxy"}}}
			},
			stopped: map[string]bool{"a": true}, events: []string{EventStopped},
		},
		"stopped already: no event, no write": {
			w: newWorld(withAffinity(), waiting("a")),
			mut: func(w *world) {
				w.in.Labelled["a"], w.in.Pods = true, nil
				w.in.ProxyNodes["a"].Spec.KubeProxyStopped = true
			},
		},
		"pod back on a labelled node: stopped false again": {
			w: newWorld(withAffinity(), waiting("a")),
			mut: func(w *world) {
				w.in.Labelled["a"] = true
				w.in.ProxyNodes["a"].Spec.KubeProxyStopped = true
			},
			stopped: map[string]bool{"a": false},
		},
		"hand back: label removed, stopped false, affinity stays this pass": {
			w: newWorld(withAffinity(), handBack("a")),
			mut: func(w *world) {
				w.in.Labelled["a"], w.in.Pods = true, nil
				w.in.ProxyNodes["a"].Spec.KubeProxyStopped = true
			},
			unlabel: []string{"a"}, stopped: map[string]bool{"a": false}, events: []string{EventReturning},
		},
		"all back: affinity removed": {
			w:        newWorld(withAffinity(), handBack("a"), proxyNode("b", "", v1alpha1.ModeKubeProxy, v1alpha1.NodeActive)),
			dsChange: "remove", events: []string{EventAffinityRemoved},
		},
		"affinity gone, roll not done: strategy waits": {
			w: newWorld(func() *appsv1.DaemonSet {
				ds := withAffinity()
				removeAffinity(ds)
				ds.Generation = 3
				return ds
			}(), handBack("a")),
		},
		"affinity gone, roll done: strategy restored": {
			w: newWorld(func() *appsv1.DaemonSet {
				ds := withAffinity()
				removeAffinity(ds)
				return ds
			}(), handBack("a")),
			dsChange: "restore", events: []string{EventStrategyRestored},
		},
		"nodes without a ProxyNode yet, unlabelled: nothing": {
			w:   newWorld(daemonSet(), proxyNode("a", "", "", "")),
			mut: func(w *world) { w.in.Labelled["b"], w.in.Nodes["b"] = false, true },
		},
		"a labelled node keeps the affinity": {
			w:   newWorld(withAffinity(), proxyNode("a", "", "", "")),
			mut: func(w *world) { w.in.Labelled["a"] = true; w.in.Labelled["gone"] = true },
		},
		"affinity someone else put there is not removed": {
			w: newWorld(func() *appsv1.DaemonSet {
				ds := withAffinity()
				delete(ds.Annotations, AnnotationAffinity)
				return ds
			}(), handBack("a")),
		},
		"affinity lost (DaemonSet replaced): added again": {
			w:        newWorld(daemonSet(), waiting("a")),
			mut:      func(w *world) { w.in.Labelled["a"] = true },
			dsChange: "add", events: []string{EventAffinityAdded},
		},
		"never label a node kube-proxy serves or that is not there": {
			w: newWorld(withAffinity(), proxyNode("a", v1alpha1.ModeNFTables, v1alpha1.ModeKubeProxy, v1alpha1.NodeProgramming),
				proxyNode("b", "", "", ""), waiting("c")),
			mut: func(w *world) { delete(w.in.Nodes, "c") },
		},
		"deleted config: proxyshift keeps serving, kube-proxy stays off": {
			w:     newWorld(withAffinity(), proxyNode("a", "", v1alpha1.ModeIPVS, v1alpha1.NodeActive)),
			label: []string{"a"}, events: []string{EventStopping},
		},
		"no kube-proxy in this cluster": {
			w: newWorld(nil, waiting("a"), handBack("b")),
			mut: func(w *world) {
				w.in.DaemonSetName = ""
				w.in.ProxyNodes["b"].Spec.KubeProxyStopped = true
			},
			stopped: map[string]bool{"a": true},
		},
		"DaemonSet missing, rules on a node: conflict, nothing written": {
			w: newWorld(nil, waiting("a"), waiting("b")),
			mut: func(w *world) {
				w.in.Labelled["a"] = true
				w.in.ProxyNodes["a"].Spec.KubeProxyStopped = true
				w.in.ProxyNodes["b"].Status.KubeProxyMode = v1alpha1.ModeIPTables
			},
			conflicts: []string{"b"}, events: []string{EventDaemonSetNotFound}, eventSubstr: `--kube-proxy-daemonset=""`,
		},
	} {
		t.Run(name, func(t *testing.T) {
			if tc.mut != nil {
				tc.mut(tc.w)
			}
			in := tc.w.in
			before := map[string]v1alpha1.ProxyNode{}
			for n, pn := range in.ProxyNodes {
				before[n] = *pn.DeepCopy()
			}
			res := Plan(in)
			got := ""
			if ds := res.DaemonSet; ds != nil {
				_, strat := ds.Annotations[AnnotationStrategy]
				switch {
				case HasAffinity(ds) && !HasAffinity(in.DaemonSet):
					got = "add"
				case !HasAffinity(ds) && HasAffinity(in.DaemonSet):
					got = "remove"
				case !strat && in.DaemonSet.Annotations[AnnotationStrategy] != "":
					got = "restore"
				default:
					got = "other"
				}
			}
			if got != tc.dsChange {
				t.Errorf("DaemonSet change %q, want %q", got, tc.dsChange)
			}
			if !slices.Equal(res.Label, tc.label) || !slices.Equal(res.Unlabel, tc.unlabel) {
				t.Errorf("label %v unlabel %v, want %v %v", res.Label, res.Unlabel, tc.label, tc.unlabel)
			}
			if s := stoppedOf(res); len(s) != len(tc.stopped) || !mapsEqual(s, tc.stopped) {
				t.Errorf("kubeProxyStopped writes %v, want %v", s, tc.stopped)
			}
			if r := reasons(res); !slices.Equal(r, tc.events) {
				t.Errorf("events %v, want %v", r, tc.events)
			}
			if !slices.Equal(res.Conflicts, tc.conflicts) {
				t.Errorf("conflicts %v, want %v", res.Conflicts, tc.conflicts)
			}
			if tc.eventSubstr != "" && !strings.Contains(res.Events[0].Message, tc.eventSubstr) {
				t.Errorf("event %q does not say %q", res.Events[0].Message, tc.eventSubstr)
			}
			for n, pn := range in.ProxyNodes {
				if b := before[n]; !equality.Semantic.DeepEqual(pn.Spec, b.Spec) {
					t.Errorf("Plan modified its input %s", n)
				}
			}
		})
	}
}

func mapsEqual(a, b map[string]bool) bool {
	for k, v := range a {
		if bv, ok := b[k]; !ok || bv != v {
			return false
		}
	}
	return true
}

// TestWalk drives one node through a takeover and a hand-back as the
// reconciler, the DaemonSet controller and the agent would, and checks the
// DaemonSet ends exactly as it began.
func TestWalk(t *testing.T) {
	orig := daemonSet()
	orig.Spec.Template.Spec.Affinity = required(term(req("os", "linux")))
	w := newWorld(orig.DeepCopy(), proxyNode("a", "", v1alpha1.ModeKubeProxy, v1alpha1.NodeActive))
	pn := w.in.ProxyNodes["a"]
	step := func() Result {
		res := Plan(w.in)
		if res.DaemonSet != nil {
			res.DaemonSet.Generation++
			w.in.DaemonSet = res.DaemonSet
		}
		for _, n := range res.Label {
			w.in.Labelled[n] = true
		}
		for _, n := range res.Unlabel {
			delete(w.in.Labelled, n)
		}
		for _, p := range res.ProxyNodes {
			w.in.ProxyNodes[p.Name] = p
			pn = p
		}
		return res
	}
	for i := 0; i < 3; i++ {
		if res := step(); res.DaemonSet != nil || len(res.Label) > 0 {
			t.Fatalf("kube-proxy serves and nothing asks for a change, yet: %+v", res)
		}
	}
	pn.Spec.DesiredMode, pn.Status.Phase = v1alpha1.ModeNFTables, v1alpha1.NodeWaitingForKubeProxy
	step()
	step()
	if !w.in.Labelled["a"] || pn.Spec.KubeProxyStopped {
		t.Fatalf("labelled %v stopped %v", w.in.Labelled["a"], pn.Spec.KubeProxyStopped)
	}
	w.in.Pods = nil // the DaemonSet controller removed the pod
	step()
	if !pn.Spec.KubeProxyStopped {
		t.Fatal("not stopped after the pod left")
	}
	pn.Status.ActiveMode, pn.Status.Phase = v1alpha1.ModeNFTables, v1alpha1.NodeActive
	step()
	pn.Spec.DesiredMode = v1alpha1.ModeKubeProxy
	step()
	if w.in.Labelled["a"] || pn.Spec.KubeProxyStopped {
		t.Fatalf("hand-back: labelled %v stopped %v", w.in.Labelled["a"], pn.Spec.KubeProxyStopped)
	}
	w.in.Pods = []Pod{kubeProxyPod("a")}
	pn.Status.ActiveMode = v1alpha1.ModeKubeProxy
	step() // affinity removed
	step() // waits for the roll
	w.in.DaemonSet.Status.ObservedGeneration = w.in.DaemonSet.Generation
	step() // strategy restored
	got := w.in.DaemonSet.DeepCopy()
	got.Generation = orig.Generation
	got.Status = orig.Status
	if !equality.Semantic.DeepEqual(got, orig) {
		t.Errorf("DaemonSet after the walk %+v, want %+v", got, orig)
	}
	if res := step(); res.DaemonSet != nil || len(res.ProxyNodes) > 0 {
		t.Errorf("not settled: %+v", res)
	}
}
