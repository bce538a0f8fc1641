package controllers

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
	"github.com/proxyshift/proxyshift/controllers/handover"
)

// HandoverControllerName names the controller that stops and restarts
// kube-proxy node by node.
const HandoverControllerName = "proxyshift-handover"

// HandoverReconciler stops kube-proxy on the nodes proxyshift takes over
// and lets it back on the nodes handed back: it reads kube-proxy's
// DaemonSet and pods, the Nodes' labels and the ProxyNodes, calls
// handover.Plan, and writes the DaemonSet, the Nodes' labels and the
// ProxyNodes' spec.kubeProxyStopped. Its decisions span the cluster (the
// DaemonSet's affinity is one for all nodes), so it has a single work item.
type HandoverReconciler struct {
	// Client reads from the manager's cache and writes to the API server.
	Client client.Client
	// Cache, when set, is the manager's cache: ProxyNodes and Nodes are
	// then read straight from its informers' stores (see cached). Nil
	// reads through Client.
	Cache cache.Cache
	// DaemonSet is kube-proxy's DaemonSet; the zero value means the
	// cluster has no kube-proxy.
	DaemonSet types.NamespacedName
	// Recorder records events; nil records none.
	Recorder events.EventRecorder

	mu sync.Mutex
	// warned are the nodes last reported as a conflict, so the Warning is
	// recorded once per conflict rather than on every pass.
	warned map[string]bool
}

// handoverRequest is the reconciler's one work item.
var handoverRequest = reconcile.Request{NamespacedName: types.NamespacedName{Name: "kube-proxy"}}

// Reconcile plans and writes one pass of the handover.
func (r *HandoverReconciler) Reconcile(ctx context.Context, _ ctrl.Request) (ctrl.Result, error) {
	in, err := r.read(ctx)
	if err != nil {
		return ctrl.Result{}, err
	}
	res := handover.Plan(in)
	if len(res.Conflicts) > 0 {
		logf.FromContext(ctx).Info("kube-proxy's DaemonSet was not found but nodes hold its rules; nothing is changed",
			"daemonSet", in.DaemonSetName, "nodes", res.Conflicts)
	}

	// Each event is recorded once the write it announces succeeded, even
	// when a later write of the pass fails (the next pass would not
	// announce it again).
	done := map[string]bool{"": true}
	defer func() { r.record(in.DaemonSet, res, done) }()
	if ds := res.DaemonSet; ds != nil {
		if err := r.Client.Update(ctx, ds); err != nil {
			return r.retry(err, "update DaemonSet "+in.DaemonSetName)
		}
		done[handover.WriteDaemonSet] = true
	}
	for _, name := range res.Label {
		if err := r.label(ctx, name, handover.LabelValue); err != nil {
			return r.retry(err, "label Node "+name)
		}
		done[handover.NodeWrite(name)] = true
	}
	for _, name := range res.Unlabel {
		if err := r.label(ctx, name, ""); err != nil {
			return r.retry(err, "unlabel Node "+name)
		}
		done[handover.NodeWrite(name)] = true
	}
	for _, pn := range res.ProxyNodes {
		// An update from the cached copy: a conflict with the ProxyConfig
		// reconciler's own update fails here and the pass runs again.
		if err := r.Client.Update(ctx, pn); err != nil {
			return r.retry(err, "update ProxyNode "+pn.Name)
		}
		done[handover.ProxyNodeWrite(pn.Name)] = true
	}
	return ctrl.Result{}, nil
}

// retry turns a failed write into a new pass: at once for a conflict or a
// vanished object (the cache was behind; its event brings the new state),
// with backoff for anything else.
func (r *HandoverReconciler) retry(err error, what string) (ctrl.Result, error) {
	if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
		return ctrl.Result{Requeue: true}, nil
	}
	return ctrl.Result{}, fmt.Errorf("%s: %w", what, err)
}

// read gathers the planner's input from the cache. Nothing is copied (a
// pass would otherwise copy every ProxyNode and Node, thousands of them,
// just to read them): the objects are the cache's own, to read and never
// change (handover.Plan changes copies).
func (r *HandoverReconciler) read(ctx context.Context) (handover.Input, error) {
	in := handover.Input{Labelled: map[string]bool{}, Nodes: map[string]bool{}}
	if pns, ok := cachedProxyNodes(ctx, r.Cache); ok {
		in.ProxyNodes = pns
	} else {
		var pns v1alpha1.ProxyNodeList
		if err := r.Client.List(ctx, &pns, client.UnsafeDisableDeepCopy); err != nil {
			return in, err
		}
		in.ProxyNodes = make(map[string]*v1alpha1.ProxyNode, len(pns.Items))
		for i := range pns.Items {
			in.ProxyNodes[pns.Items[i].Name] = &pns.Items[i]
		}
	}
	if r.DaemonSet.Name == "" {
		return in, nil
	}
	in.DaemonSetName = r.DaemonSet.String()
	ds := &appsv1.DaemonSet{}
	switch err := r.Client.Get(ctx, r.DaemonSet, ds); {
	case apierrors.IsNotFound(err):
		return in, nil
	case err != nil:
		return in, err
	}
	in.DaemonSet = ds
	addNode := func(n *metav1.PartialObjectMetadata) {
		in.Nodes[n.Name] = n.DeletionTimestamp == nil
		in.Labelled[n.Name] = n.Labels[handover.LabelKey] == handover.LabelValue
	}
	if objs, ok := cached(ctx, r.Cache, nodeMetadata()); ok {
		for _, o := range objs {
			if n, ok := o.(*metav1.PartialObjectMetadata); ok {
				addNode(n)
			}
		}
	} else {
		var nodes metav1.PartialObjectMetadataList
		nodes.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("NodeList"))
		if err := r.Client.List(ctx, &nodes, client.UnsafeDisableDeepCopy); err != nil {
			return in, err
		}
		for i := range nodes.Items {
			addNode(&nodes.Items[i])
		}
	}
	var pods corev1.PodList
	if err := r.Client.List(ctx, &pods, client.InNamespace(r.DaemonSet.Namespace), client.UnsafeDisableDeepCopy); err != nil {
		return in, err
	}
	for _, p := range pods.Items {
		in.Pods = append(in.Pods, handover.Pod{Labels: p.Labels, Node: p.Spec.NodeName})
	}
	return in, nil
}

// label sets the handover label on a Node, or removes it when value is
// empty, with a merge patch of that one label.
func (r *HandoverReconciler) label(ctx context.Context, node, value string) error {
	var v any
	if value != "" {
		v = value
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]any{handover.LabelKey: v}}})
	if err != nil {
		return err
	}
	obj := &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Name: node}}
	obj.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Node"))
	return r.Client.Patch(ctx, obj, client.RawPatch(types.MergePatchType, patch))
}

// record records the pass's events whose write is done: those about a
// node on its ProxyNode, the others on the DaemonSet; a conflict's Warning
// only when the node was not in conflict on the last pass.
func (r *HandoverReconciler) record(ds *appsv1.DaemonSet, res handover.Result, done map[string]bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := map[string]bool{}
	for _, n := range res.Conflicts {
		now[n] = true
	}
	warned := r.warned
	r.warned = now
	if r.Recorder == nil {
		return
	}
	for _, e := range res.Events {
		if !done[e.After] || (e.Reason == handover.EventDaemonSetNotFound && warned[e.Node]) {
			continue
		}
		typ := corev1.EventTypeNormal
		if e.Warning {
			typ = corev1.EventTypeWarning
		}
		var regarding = relatedProxyNode(e.Node)
		if e.Node == "" {
			if ds == nil {
				continue
			}
			regarding = ds
		}
		r.Recorder.Eventf(regarding, nil, typ, e.Reason, "Handover", "%s", truncateNote(e.Message))
	}
}

// SetupWithManager registers the reconciler and its watches, each mapped
// to the one work item: ProxyNodes (changes of what their node needs of
// kube-proxy, or of spec.kubeProxyStopped), and with a DaemonSet
// configured, that DaemonSet, the pods of its namespace (the cache holds
// only those, trimmed: CacheOptions; only binding, labels and deletion
// matter) and Nodes (metadata only: the label and deletion).
func (r *HandoverReconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.Client == nil {
		r.Client = mgr.GetClient()
	}
	all := handler.EnqueueRequestsFromMapFunc(func(context.Context, client.Object) []reconcile.Request {
		return []reconcile.Request{handoverRequest}
	})
	b := ctrl.NewControllerManagedBy(mgr).
		Named(HandoverControllerName).
		Watches(&v1alpha1.ProxyNode{}, all, builder.WithPredicates(predicate.Funcs{
			UpdateFunc: func(e event.UpdateEvent) bool {
				o, ok1 := e.ObjectOld.(*v1alpha1.ProxyNode)
				n, ok2 := e.ObjectNew.(*v1alpha1.ProxyNode)
				return !ok1 || !ok2 || handover.Want(o) != handover.Want(n) ||
					o.Spec.KubeProxyStopped != n.Spec.KubeProxyStopped || o.Status.KubeProxyMode != n.Status.KubeProxyMode
			},
		}))
	if r.DaemonSet.Name != "" {
		ns := r.DaemonSet.Namespace
		b = b.
			Watches(&appsv1.DaemonSet{}, all, builder.WithPredicates(predicate.NewPredicateFuncs(func(o client.Object) bool {
				return o.GetNamespace() == ns && o.GetName() == r.DaemonSet.Name
			}))).
			Watches(&corev1.Pod{}, all, builder.WithPredicates(predicate.Funcs{
				UpdateFunc: func(e event.UpdateEvent) bool {
					o, ok1 := e.ObjectOld.(*corev1.Pod)
					n, ok2 := e.ObjectNew.(*corev1.Pod)
					return !ok1 || !ok2 || o.Spec.NodeName != n.Spec.NodeName || !labels.Equals(o.Labels, n.Labels) ||
						(o.DeletionTimestamp == nil) != (n.DeletionTimestamp == nil)
				},
			})).
			Watches(&corev1.Node{}, all, builder.OnlyMetadata, builder.WithPredicates(predicate.Funcs{
				UpdateFunc: func(e event.UpdateEvent) bool {
					return e.ObjectOld.GetLabels()[handover.LabelKey] != e.ObjectNew.GetLabels()[handover.LabelKey] ||
						(e.ObjectOld.GetDeletionTimestamp() == nil) != (e.ObjectNew.GetDeletionTimestamp() == nil)
				},
			}))
	}
	return b.Complete(r)
}
