// Package handover holds the envtest scenario of the handover between
// kube-proxy and proxyshift: a real API server with a kube-system/kube-proxy
// DaemonSet object, the operator's reconcilers in a real manager, and the
// test itself standing in for what envtest lacks: it creates and deletes
// kube-proxy's pods (no DaemonSet controller, no kubelet), writes the
// DaemonSet's rollout status, and writes ProxyNode statuses as an agent
// would.
package handover

import (
	"context"
	"slices"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlconfig "sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
	"github.com/proxyshift/proxyshift/controllers"
	"github.com/proxyshift/proxyshift/controllers/handover"
	"github.com/proxyshift/proxyshift/test/testenv"
	"github.com/proxyshift/proxyshift/test/testlog"
)

func init() { testlog.Init() }

const ns = "kube-system"

var dsKey = types.NamespacedName{Namespace: ns, Name: "kube-proxy"}

// world is the test's API server and client.
type world struct {
	t   *testing.T
	ctx context.Context
	c   client.Client
}

func (w *world) waitFor(what string, cond func() bool) {
	w.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			w.t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// holds checks cond stays true for a while.
func (w *world) holds(what string, cond func() bool) {
	w.t.Helper()
	for end := time.Now().Add(1500 * time.Millisecond); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		if !cond() {
			w.t.Fatalf("%s stopped holding", what)
		}
	}
}

func (w *world) must(err error) {
	w.t.Helper()
	if err != nil {
		w.t.Fatal(err)
	}
}

func (w *world) ds() *appsv1.DaemonSet {
	w.t.Helper()
	ds := &appsv1.DaemonSet{}
	w.must(w.c.Get(w.ctx, dsKey, ds))
	return ds
}

func (w *world) proxyNode(name string) *v1alpha1.ProxyNode {
	w.t.Helper()
	pn := &v1alpha1.ProxyNode{}
	w.must(w.c.Get(w.ctx, types.NamespacedName{Name: name}, pn))
	return pn
}

func (w *world) labelled(node string) bool {
	w.t.Helper()
	n := &corev1.Node{}
	w.must(w.c.Get(w.ctx, types.NamespacedName{Name: node}, n))
	return n.Labels[handover.LabelKey] == handover.LabelValue
}

// agent writes a ProxyNode's status as the node's agent would.
func (w *world) agent(node string, active v1alpha1.ProxyMode, phase v1alpha1.NodePhase, kubeProxyMode v1alpha1.ProxyMode) {
	w.t.Helper()
	w.must(retry.RetryOnConflict(retry.DefaultRetry, func() error {
		pn := w.proxyNode(node)
		pn.Status.ActiveMode, pn.Status.Phase, pn.Status.KubeProxyMode = active, phase, kubeProxyMode
		pn.Status.Kernel = &v1alpha1.KernelFacts{NFTables: v1alpha1.CapabilityYes}
		return w.c.Status().Update(w.ctx, pn)
	}))
}

// desire writes a ProxyNode's spec.desiredMode as a rollout would.
func (w *world) desire(node string, mode v1alpha1.ProxyMode) {
	w.t.Helper()
	w.must(retry.RetryOnConflict(retry.DefaultRetry, func() error {
		pn := w.proxyNode(node)
		pn.Spec.DesiredMode = mode
		return w.c.Update(w.ctx, pn)
	}))
}

// kubeProxyPod creates kube-proxy's pod on a node, as the DaemonSet
// controller would.
func (w *world) kubeProxyPod(node string) {
	w.t.Helper()
	w.must(w.c.Create(w.ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "kube-proxy-" + node, Labels: map[string]string{"k8s-app": "kube-proxy"}},
		Spec: corev1.PodSpec{NodeName: node, ServiceAccountName: "kube-proxy", AutomountServiceAccountToken: ptr.To(false),
			Containers: []corev1.Container{{Name: "kube-proxy", Image: "registry.k8s.io/kube-proxy"}}},
	}))
}

func (w *world) deletePod(node string, grace int64) {
	w.t.Helper()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "kube-proxy-" + node}}
	w.must(w.c.Delete(w.ctx, pod, client.GracePeriodSeconds(grace)))
}

// events lists the reasons of the events about an object (by name).
func (w *world) events(name string) []string {
	w.t.Helper()
	var l eventsv1.EventList
	w.must(w.c.List(w.ctx, &l))
	var out []string
	for _, e := range l.Items {
		if e.Regarding.Name == name {
			out = append(out, e.Reason)
		}
	}
	return out
}

func originalDaemonSet() *appsv1.DaemonSet {
	labels := map[string]string{"k8s-app": "kube-proxy"}
	linux := corev1.NodeSelectorRequirement{Key: "kubernetes.io/os", Operator: corev1.NodeSelectorOpIn, Values: []string{"linux"}}
	edge := corev1.NodeSelectorRequirement{Key: "edge", Operator: corev1.NodeSelectorOpExists}
	return &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "kube-proxy", Labels: labels},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					ServiceAccountName: "kube-proxy",
					HostNetwork:        true,
					Containers:         []corev1.Container{{Name: "kube-proxy", Image: "registry.k8s.io/kube-proxy"}},
					// Two ORed terms: the exclusion must go into both.
					Affinity: &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
						NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{linux}}, {MatchExpressions: []corev1.NodeSelectorRequirement{edge}}},
					}}},
				},
			},
		},
	}
}

// TestHandover walks node-1 from kube-proxy to nftables and back while
// node-2 stays with kube-proxy, then removes the DaemonSet.
func TestHandover(t *testing.T) {
	env := testenv.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	w := &world{t: t, ctx: ctx, c: env.Client}
	nodes := []string{"node-1", "node-2"}

	// The cluster before proxyshift: kube-proxy's DaemonSet and its pods.
	w.must(w.c.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "kube-proxy"}}))
	w.must(w.c.Create(ctx, originalDaemonSet()))
	orig := w.ds()
	for _, n := range nodes {
		w.must(w.c.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n, Labels: map[string]string{"kubernetes.io/os": "linux"}}}))
		w.kubeProxyPod(n)
	}

	opts := controllers.Options{KubeProxyDaemonSet: controllers.DefaultKubeProxyDaemonSet}
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{
		Scheme:                 env.Scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Cache:                  controllers.CacheOptions(opts),
		Controller:             ctrlconfig.Controller{SkipNameValidation: ptr.To(true)},
	})
	w.must(err)
	_, err = controllers.SetupWithManager(mgr, opts)
	w.must(err)
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("manager: %v", err)
		}
	})

	// Installing changes nothing: agents report kube-proxy serving.
	w.waitFor("every node's ProxyNode", func() bool {
		var l v1alpha1.ProxyNodeList
		w.must(w.c.List(ctx, &l))
		return len(l.Items) == len(nodes)
	})
	for _, n := range nodes {
		w.agent(n, v1alpha1.ModeKubeProxy, v1alpha1.NodeActive, v1alpha1.ModeIPTables)
	}
	// Taking node-1 over: while its agent programs nftables, kube-proxy
	// still serves it and stays.
	w.desire("node-1", v1alpha1.ModeNFTables)
	w.agent("node-1", v1alpha1.ModeKubeProxy, v1alpha1.NodeProgramming, v1alpha1.ModeIPTables)
	w.holds("nothing changed while kube-proxy serves", func() bool {
		ds := w.ds()
		return ds.Generation == orig.Generation && ds.Annotations[handover.AnnotationAffinity] == "" &&
			!w.labelled("node-1") && !w.labelled("node-2") && !w.proxyNode("node-1").Spec.KubeProxyStopped
	})

	// nftables programmed and verified: kube-proxy must leave node-1. The
	// affinity is added once, into both terms, with a surging rollout.
	w.agent("node-1", v1alpha1.ModeNFTables, v1alpha1.NodeWaitingForKubeProxy, v1alpha1.ModeIPTables)
	w.waitFor("node-1 labelled", func() bool { return w.labelled("node-1") })
	ds := w.ds()
	if ds.Generation != orig.Generation+1 || !handover.HasAffinity(ds) || len(ds.Spec.Template.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms) != 2 {
		t.Fatalf("DaemonSet generation %d (was %d), affinity %+v", ds.Generation, orig.Generation, ds.Spec.Template.Spec.Affinity)
	}
	if ru := ds.Spec.UpdateStrategy.RollingUpdate; ru == nil || ru.MaxSurge.IntValue() != 1 || ru.MaxUnavailable.IntValue() != 0 ||
		ds.Annotations[handover.AnnotationStrategy] == "" {
		t.Fatalf("strategy %+v, annotations %v", ds.Spec.UpdateStrategy, ds.Annotations)
	}
	if w.labelled("node-2") {
		t.Fatal("node-2, which kube-proxy serves, was labelled")
	}

	// kube-proxy's pod is still there, then terminating: not stopped.
	w.holds("kubeProxyStopped false while the pod runs", func() bool { return !w.proxyNode("node-1").Spec.KubeProxyStopped })
	w.deletePod("node-1", 30)
	w.holds("kubeProxyStopped false while the pod terminates", func() bool { return !w.proxyNode("node-1").Spec.KubeProxyStopped })
	w.deletePod("node-1", 0)
	w.waitFor("node-1 kubeProxyStopped", func() bool { return w.proxyNode("node-1").Spec.KubeProxyStopped })
	if w.proxyNode("node-2").Spec.KubeProxyStopped {
		t.Fatal("node-2 reported stopped")
	}
	w.waitFor("KubeProxyStopping and KubeProxyStopped events about node-1", func() bool {
		ev := w.events("node-1")
		return slices.Contains(ev, handover.EventStopping) && slices.Contains(ev, handover.EventStopped)
	})

	// The agent removes kube-proxy's leftovers and serves with nftables.
	w.agent("node-1", v1alpha1.ModeNFTables, v1alpha1.NodeActive, "")
	w.holds("node-1 stays labelled and stopped, the affinity added once", func() bool {
		return w.labelled("node-1") && w.proxyNode("node-1").Spec.KubeProxyStopped && w.ds().Generation == orig.Generation+1
	})

	// Hand-back: kube-proxy returns to node-1.
	w.desire("node-1", v1alpha1.ModeKubeProxy)
	w.agent("node-1", v1alpha1.ModeNFTables, v1alpha1.NodeWaitingForKubeProxy, "")
	w.waitFor("node-1 unlabelled, not stopped", func() bool {
		return !w.labelled("node-1") && !w.proxyNode("node-1").Spec.KubeProxyStopped
	})
	w.kubeProxyPod("node-1") // the DaemonSet controller schedules it again
	w.agent("node-1", v1alpha1.ModeKubeProxy, v1alpha1.NodeActive, v1alpha1.ModeIPTables)

	// Every node is back: the affinity goes; the strategy stays until the
	// roll that removal starts has finished.
	w.waitFor("the affinity removed", func() bool { return !handover.HasAffinity(w.ds()) })
	w.holds("the strategy waits for the roll", func() bool { return w.ds().Annotations[handover.AnnotationStrategy] != "" })
	w.must(retry.RetryOnConflict(retry.DefaultRetry, func() error {
		ds := w.ds()
		ds.Status = appsv1.DaemonSetStatus{ObservedGeneration: ds.Generation, DesiredNumberScheduled: 2, CurrentNumberScheduled: 2,
			UpdatedNumberScheduled: 2, NumberReady: 2, NumberAvailable: 2}
		return w.c.Status().Update(ctx, ds)
	}))
	w.waitFor("the strategy restored", func() bool { return w.ds().Annotations[handover.AnnotationStrategy] == "" })
	ds = w.ds()
	if !equality.Semantic.DeepEqual(ds.Spec, orig.Spec) {
		t.Errorf("the DaemonSet's spec is not as it was:\n%+v\nwant\n%+v", ds.Spec, orig.Spec)
	}
	// The API server counts template changes in an annotation of its own;
	// every other annotation is as it was.
	const templateGeneration = "deprecated.daemonset.template.generation"
	delete(ds.Annotations, templateGeneration)
	delete(orig.Annotations, templateGeneration)
	if !equality.Semantic.DeepEqual(ds.Annotations, orig.Annotations) {
		t.Errorf("annotations %v, want %v", ds.Annotations, orig.Annotations)
	}
	w.waitFor("the DaemonSet's events and node-1's KubeProxyReturning", func() bool {
		ev := w.events("kube-proxy")
		return slices.Contains(ev, handover.EventAffinityAdded) && slices.Contains(ev, handover.EventAffinityRemoved) &&
			slices.Contains(ev, handover.EventStrategyRestored) && slices.Contains(w.events("node-1"), handover.EventReturning)
	})

	// Without its DaemonSet, nodes holding kube-proxy's rules are a
	// conflict: reported, nothing written.
	w.must(w.c.Delete(ctx, w.ds()))
	w.waitFor("the DaemonSet gone", func() bool {
		return apierrors.IsNotFound(w.c.Get(ctx, dsKey, &appsv1.DaemonSet{}))
	})
	w.waitFor("a conflict Warning about node-2", func() bool {
		return slices.Contains(w.events("node-2"), handover.EventDaemonSetNotFound)
	})
	for _, n := range nodes {
		if w.labelled(n) || w.proxyNode(n).Spec.KubeProxyStopped {
			t.Errorf("%s changed: labelled %v, stopped %v", n, w.labelled(n), w.proxyNode(n).Spec.KubeProxyStopped)
		}
	}
}
