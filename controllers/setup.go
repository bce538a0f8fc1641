package controllers

import (
	"context"
	"fmt"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
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
	"github.com/proxyshift/proxyshift/controllers/findings"
	"github.com/proxyshift/proxyshift/controllers/plan"
)

// DefaultKubeProxyDaemonSet is where kubeadm puts kube-proxy's DaemonSet.
var DefaultKubeProxyDaemonSet = types.NamespacedName{Namespace: "kube-system", Name: "kube-proxy"}

// DefaultKubeProxyConfigMap and DefaultKubeProxyConfigKey are where
// kubeadm keeps kube-proxy's configuration file.
var (
	DefaultKubeProxyConfigMap = types.NamespacedName{Namespace: "kube-system", Name: "kube-proxy"}
	DefaultKubeProxyConfigKey = "config.conf"
)

// Options are the operator's settings beyond the manager's.
type Options struct {
	// KubeProxyDaemonSet is kube-proxy's DaemonSet; the zero value says
	// the cluster has no kube-proxy (see controllers/handover).
	KubeProxyDaemonSet types.NamespacedName
	// KubeProxyConfigMap is the ConfigMap holding kube-proxy's
	// configuration file under KubeProxyConfigKey; spec.kubeProxy changes
	// the mode in it. The zero value: none (spec.kubeProxy is refused).
	KubeProxyConfigMap types.NamespacedName
	KubeProxyConfigKey string
}

// ParseNamespacedName reads "namespace/name" (the --kube-proxy-daemonset
// and --kube-proxy-configmap flags); "" is the zero value: none.
func ParseNamespacedName(s string) (types.NamespacedName, error) {
	if s == "" {
		return types.NamespacedName{}, nil
	}
	ns, name, ok := strings.Cut(s, "/")
	if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
		return types.NamespacedName{}, fmt.Errorf("%q is not namespace/name", s)
	}
	return types.NamespacedName{Namespace: ns, Name: name}, nil
}

// CacheOptions are the cache settings the operator should run its manager
// with. Cached objects keep only what the operator reads: managed fields
// go from everything; Node metadata keeps name, UID, labels and deletion
// (node annotations are often large); ProxyNode status loses the sync
// figures the agent refreshes all the time. ProxyNode metadata and spec
// stay whole, because the reconciler updates ProxyNodes from the cache.
// Services keep only what the behaviour-diff preflight reads
// (findings.Trim).
// With a kube-proxy DaemonSet, the cache holds that DaemonSet only (whole:
// it is updated from the cache) and the pods of its namespace only, each
// trimmed to its name, labels, deletion and node; with a kube-proxy
// ConfigMap, that ConfigMap only (whole: it is updated from the cache).
func CacheOptions(opts Options) cache.Options {
	strip := cache.TransformStripManagedFields()
	co := cache.Options{DefaultTransform: func(in any) (any, error) {
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
		case *corev1.Service:
			return findings.Trim(o), nil
		case *corev1.Pod:
			return &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: o.Name, Namespace: o.Namespace, UID: o.UID, ResourceVersion: o.ResourceVersion,
					Labels: o.Labels, DeletionTimestamp: o.DeletionTimestamp},
				Spec: corev1.PodSpec{NodeName: o.Spec.NodeName},
			}, nil
		}
		return out, nil
	}}
	co.ByObject = map[client.Object]cache.ByObject{}
	if ds := opts.KubeProxyDaemonSet; ds.Name != "" {
		co.ByObject[&appsv1.DaemonSet{}] = cache.ByObject{Namespaces: map[string]cache.Config{ds.Namespace: {}}, Field: fields.OneTermEqualSelector("metadata.name", ds.Name)}
		co.ByObject[&corev1.Pod{}] = cache.ByObject{Namespaces: map[string]cache.Config{ds.Namespace: {}}}
	}
	if cm := opts.KubeProxyConfigMap; cm.Name != "" {
		co.ByObject[&corev1.ConfigMap{}] = cache.ByObject{Namespaces: map[string]cache.Config{cm.Namespace: {}}, Field: fields.OneTermEqualSelector("metadata.name", cm.Name)}
	}
	return co
}

// SetupWithManager builds the operator's reconcilers from the manager and
// registers them: the ProxyConfig reconciler (returned), the one that
// gives every Node its ProxyNode, and the one that stops and restarts
// kube-proxy per node. It is what cmd/operator calls, with the manager
// built with CacheOptions(opts).
func SetupWithManager(mgr ctrl.Manager, opts Options) (*ProxyConfigReconciler, error) {
	r := &ProxyConfigReconciler{
		Client:             mgr.GetClient(),
		Cache:              mgr.GetCache(),
		APIReader:          mgr.GetAPIReader(),
		Recorder:           mgr.GetEventRecorder(ControllerName),
		KubeProxyDaemonSet: opts.KubeProxyDaemonSet,
		KubeProxyConfigMap: opts.KubeProxyConfigMap,
		KubeProxyConfigKey: opts.KubeProxyConfigKey,
	}
	if err := r.SetupWithManager(mgr); err != nil {
		return nil, err
	}
	if err := (&ProxyNodeReconciler{Client: mgr.GetClient()}).SetupWithManager(mgr); err != nil {
		return nil, err
	}
	h := &HandoverReconciler{Client: mgr.GetClient(), Cache: mgr.GetCache(), DaemonSet: opts.KubeProxyDaemonSet, Recorder: mgr.GetEventRecorder(HandoverControllerName)}
	return r, h.SetupWithManager(mgr)
}

// SetupWithManager registers the reconciler and its watches: ProxyConfigs
// (spec changes; a change of one re-checks the others for conflicts),
// Nodes (metadata only: creation, deletion, label changes), ProxyNodes
// (changes that matter to planning), each mapped to the ProxyConfigs
// concerned, and Services (trimmed; every config). There is no periodic resync; timeouts and pauses are handled
// with RequeueAfter.
func (r *ProxyConfigReconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.Client == nil {
		r.Client = mgr.GetClient()
	}
	m := &mapper{c: mgr.GetClient()}
	b := ctrl.NewControllerManagedBy(mgr).
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
		})
	// Services feed every plan's findings: a Service created, deleted or
	// changed in what the findings read re-plans every config.
	everyConfig := func(ctx context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
		m.others(ctx, "", q)
	}
	b = b.Watches(&corev1.Service{}, handler.Funcs{
		CreateFunc: func(ctx context.Context, _ event.CreateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			everyConfig(ctx, q)
		},
		UpdateFunc: func(ctx context.Context, e event.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			o, ok1 := e.ObjectOld.(*corev1.Service)
			n, ok2 := e.ObjectNew.(*corev1.Service)
			if !ok1 || !ok2 || !apiequality.Semantic.DeepEqual(o.Spec, n.Spec) || !apiequality.Semantic.DeepEqual(o.Labels, n.Labels) ||
				!apiequality.Semantic.DeepEqual(o.Annotations, n.Annotations) {
				everyConfig(ctx, q)
			}
		},
		DeleteFunc: func(ctx context.Context, _ event.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			everyConfig(ctx, q)
		},
	})
	if cm := r.KubeProxyConfigMap; cm.Name != "" {
		// A change of kube-proxy's mode reads its ConfigMap: any change
		// of it re-plans every config.
		b = b.Watches(&corev1.ConfigMap{}, handler.Funcs{
			CreateFunc: func(ctx context.Context, _ event.CreateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
				everyConfig(ctx, q)
			},
			UpdateFunc: func(ctx context.Context, _ event.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
				everyConfig(ctx, q)
			},
			DeleteFunc: func(ctx context.Context, _ event.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
				everyConfig(ctx, q)
			},
		})
	}
	if ds := r.KubeProxyDaemonSet; ds.Name != "" {
		// Where kube-proxy's pods run decides whether its mode may change
		// (plan.KubeProxy.PodNodes): a pod bound or gone re-plans every
		// config.
		b = b.Watches(&corev1.Pod{}, handler.Funcs{
			UpdateFunc: func(ctx context.Context, e event.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
				o, ok1 := e.ObjectOld.(*corev1.Pod)
				n, ok2 := e.ObjectNew.(*corev1.Pod)
				if !ok1 || !ok2 || o.Spec.NodeName != n.Spec.NodeName {
					everyConfig(ctx, q)
				}
			},
			DeleteFunc: func(ctx context.Context, _ event.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
				everyConfig(ctx, q)
			},
		})
		// Whether kube-proxy's DaemonSet exists is part of every plan's
		// preflight: its creation or deletion re-plans every config.
		b = b.Watches(&appsv1.DaemonSet{}, handler.Funcs{
			CreateFunc: func(ctx context.Context, e event.CreateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
				if client.ObjectKeyFromObject(e.Object) == ds {
					everyConfig(ctx, q)
				}
			},
			DeleteFunc: func(ctx context.Context, e event.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
				if client.ObjectKeyFromObject(e.Object) == ds {
					everyConfig(ctx, q)
				}
			},
		})
	}
	return b.Complete(r)
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
	if os.ActiveMode != ns.ActiveMode || os.Phase != ns.Phase || os.KubeProxyMode != ns.KubeProxyMode || !apiequality.Semantic.DeepEqual(os.ObservedConfig, ns.ObservedConfig) {
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
