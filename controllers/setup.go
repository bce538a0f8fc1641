package controllers

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
	"github.com/proxyshift/proxyshift/controllers/plan"
)

// CacheOptions are the cache settings the operator should run its manager
// with. Cached objects keep only what the operator reads: managed fields
// go from everything; Node metadata keeps name, UID, labels and deletion
// (node annotations are often large); ProxyNode status loses the sync
// figures the agent refreshes all the time. ProxyNode metadata and spec
// stay whole, because the reconciler updates ProxyNodes from the cache.
func CacheOptions() cache.Options {
	strip := cache.TransformStripManagedFields()
	return cache.Options{DefaultTransform: func(in any) (any, error) {
		out, err := strip(in)
		if err != nil {
			return out, err
		}
		switch o := out.(type) {
		case *metav1.PartialObjectMetadata:
			if o.Kind == "Node" || o.Kind == "" {
				o.Annotations, o.OwnerReferences, o.Finalizers = nil, nil, nil
			}
		case *v1alpha1.ProxyNode:
			st := &o.Status
			st.LastSyncTime, st.LastSyncDuration, st.Counts = nil, nil, nil
			if st.Kernel != nil {
				st.Kernel.Version, st.Kernel.ReportedTime = "", nil
			}
		}
		return out, nil
	}}
}

// SetupWithManager builds the operator's reconcilers from the manager and
// registers them: the ProxyConfig reconciler (returned) and the one that
// gives every Node its ProxyNode. It is what cmd/operator calls.
func SetupWithManager(mgr ctrl.Manager) (*ProxyConfigReconciler, error) {
	r := &ProxyConfigReconciler{
		Client:    mgr.GetClient(),
		Cache:     mgr.GetCache(),
		APIReader: mgr.GetAPIReader(),
		Recorder:  mgr.GetEventRecorder(ControllerName),
	}
	if err := r.SetupWithManager(mgr); err != nil {
		return nil, err
	}
	return r, (&ProxyNodeReconciler{Client: mgr.GetClient()}).SetupWithManager(mgr)
}

// SetupWithManager registers the reconciler and its watches: ProxyConfigs
// (spec changes; a change of one re-checks the others for conflicts),
// Nodes (metadata only: creation, deletion, label changes) and ProxyNodes
// (changes that matter to planning), each mapped to the ProxyConfigs
// concerned. There is no periodic resync; timeouts and pauses are handled
// with RequeueAfter.
func (r *ProxyConfigReconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.Client == nil {
		r.Client = mgr.GetClient()
	}
	m := &mapper{c: mgr.GetClient()}
	return ctrl.NewControllerManagedBy(mgr).
		Named(ControllerName).
		For(&v1alpha1.ProxyConfig{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Watches(&v1alpha1.ProxyConfig{}, handler.Funcs{
			CreateFunc: func(ctx context.Context, e event.CreateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
				m.others(ctx, e.Object.GetName(), q)
			},
			UpdateFunc: func(ctx context.Context, e event.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
				if e.ObjectOld.GetGeneration() != e.ObjectNew.GetGeneration() || e.ObjectOld.GetDeletionTimestamp() != e.ObjectNew.GetDeletionTimestamp() {
					m.others(ctx, e.ObjectNew.GetName(), q)
				}
			},
			DeleteFunc: func(ctx context.Context, e event.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
				m.others(ctx, e.Object.GetName(), q)
			},
		}).
		Watches(&corev1.Node{}, handler.Funcs{
			CreateFunc: func(ctx context.Context, e event.CreateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
				m.byLabels(ctx, q, e.Object.GetLabels())
			},
			UpdateFunc: func(ctx context.Context, e event.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
				o, n := e.ObjectOld, e.ObjectNew
				if !labels.Equals(o.GetLabels(), n.GetLabels()) || (o.GetDeletionTimestamp() == nil) != (n.GetDeletionTimestamp() == nil) || o.GetUID() != n.GetUID() {
					m.byLabels(ctx, q, o.GetLabels(), n.GetLabels())
				}
			},
			DeleteFunc: func(ctx context.Context, e event.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
				m.byLabels(ctx, q, e.Object.GetLabels())
			},
		}, builder.OnlyMetadata).
		Watches(&v1alpha1.ProxyNode{}, handler.Funcs{
			CreateFunc: func(ctx context.Context, e event.CreateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
				m.forProxyNode(ctx, q, e.Object)
			},
			UpdateFunc: func(ctx context.Context, e event.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
				o, ok1 := e.ObjectOld.(*v1alpha1.ProxyNode)
				n, ok2 := e.ObjectNew.(*v1alpha1.ProxyNode)
				if ok1 && ok2 && !relevantChange(o, n) {
					return
				}
				m.forProxyNode(ctx, q, e.ObjectOld, e.ObjectNew)
			},
			DeleteFunc: func(ctx context.Context, e event.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
				m.forProxyNode(ctx, q, e.Object)
			},
		}).
		Complete(r)
}

// relevantChange says whether a ProxyNode update can change a plan: its
// spec or the operator's annotations, ownership, deletion, or the status
// fields the planner reads. Sync times and rule counts, which the agent
// updates all the time, do not.
func relevantChange(o, n *v1alpha1.ProxyNode) bool {
	if !apiequality.Semantic.DeepEqual(o.Spec, n.Spec) || !apiequality.Semantic.DeepEqual(o.Annotations, n.Annotations) ||
		!apiequality.Semantic.DeepEqual(o.OwnerReferences, n.OwnerReferences) || (o.DeletionTimestamp == nil) != (n.DeletionTimestamp == nil) {
		return true
	}
	os, ns := &o.Status, &n.Status
	if os.ActiveMode != ns.ActiveMode || os.Phase != ns.Phase || !apiequality.Semantic.DeepEqual(os.ObservedConfig, ns.ObservedConfig) {
		return true
	}
	if (os.Kernel == nil) != (ns.Kernel == nil) {
		return true
	}
	if os.Kernel != nil {
		ok, nk := os.Kernel.DeepCopy(), ns.Kernel.DeepCopy()
		ok.ReportedTime, nk.ReportedTime = nil, nil
		if !apiequality.Semantic.DeepEqual(ok, nk) {
			return true
		}
	}
	if len(os.Conditions) != len(ns.Conditions) {
		return true
	}
	for i := range os.Conditions {
		a, b := os.Conditions[i], ns.Conditions[i]
		if a.Type != b.Type || a.Status != b.Status || a.Reason != b.Reason {
			return true
		}
	}
	return false
}

// mapper maps Node, ProxyNode and ProxyConfig events to the ProxyConfigs
// they concern, reading from the cache.
type mapper struct {
	c client.Client
}

func (m *mapper) configs(ctx context.Context) []v1alpha1.ProxyConfig {
	var l v1alpha1.ProxyConfigList
	if err := m.c.List(ctx, &l); err != nil {
		return nil
	}
	return l.Items
}

func add(q workqueue.TypedRateLimitingInterface[reconcile.Request], name string) {
	q.Add(reconcile.Request{NamespacedName: types.NamespacedName{Name: name}})
}

// others enqueues every ProxyConfig but the named one: a change to one's
// selector can start or end a conflict with any other.
func (m *mapper) others(ctx context.Context, name string, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	for _, c := range m.configs(ctx) {
		if c.Name != name {
			add(q, c.Name)
		}
	}
}

// byLabels enqueues the ProxyConfigs selecting a node with any of these
// label sets.
func (m *mapper) byLabels(ctx context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request], sets ...map[string]string) {
	cfgs := m.configs(ctx)
	for i := range cfgs {
		c := &cfgs[i]
		sel, err := plan.Selector(c)
		if err != nil {
			add(q, c.Name) // let it report its invalid selector
			continue
		}
		for _, s := range sets {
			if sel.Matches(labels.Set(s)) {
				add(q, c.Name)
				break
			}
		}
	}
}

// forProxyNode enqueues the configs selecting the ProxyNode's Node, and the
// config its spec names.
func (m *mapper) forProxyNode(ctx context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request], objs ...client.Object) {
	for _, o := range objs {
		pn, ok := o.(*v1alpha1.ProxyNode)
		if !ok {
			continue
		}
		if pn.Spec.ConfigRef != nil {
			add(q, pn.Spec.ConfigRef.Name)
		}
	}
	name := objs[len(objs)-1].GetName()
	var node metav1.PartialObjectMetadata
	node.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Node"))
	if err := m.c.Get(ctx, types.NamespacedName{Name: name}, &node); err != nil {
		return
	}
	m.byLabels(ctx, q, node.Labels)
}
