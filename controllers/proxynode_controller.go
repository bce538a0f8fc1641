package controllers

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
	"github.com/proxyshift/proxyshift/controllers/plan"
)

// NodeControllerName names the controller that gives every Node its
// ProxyNode.
const NodeControllerName = "proxyshift-nodes"

// ProxyNodeReconciler gives every Node a ProxyNode as soon as it exists,
// before any ProxyConfig selects it: the agent on that node then has an
// object to report on (who serves the node, what its kernel can do), so
// `kubectl get proxynodes` shows every node right after installing, while
// nothing asks any node to change (the spec stays empty). ProxyNodes are
// owned by their Node, so the garbage collector removes them with it.
type ProxyNodeReconciler struct {
	// Client reads Nodes' metadata and ProxyNodes from the cache and
	// creates ProxyNodes.
	Client client.Client
}

// Reconcile creates the named Node's ProxyNode when it has none.
func (r *ProxyNodeReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var node metav1.PartialObjectMetadata
	node.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Node"))
	if err := r.Client.Get(ctx, req.NamespacedName, &node); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if node.DeletionTimestamp != nil {
		return ctrl.Result{}, nil
	}
	var pn v1alpha1.ProxyNode
	err := r.Client.Get(ctx, req.NamespacedName, &pn)
	if err == nil || !apierrors.IsNotFound(err) {
		return ctrl.Result{}, err
	}
	err = r.Client.Create(ctx, plan.NewProxyNode(plan.Node{Name: node.Name, UID: node.UID}))
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return ctrl.Result{}, fmt.Errorf("create ProxyNode %s: %w", node.Name, err)
	}
	return ctrl.Result{}, nil
}

// nodeWorkers is how many Nodes get their ProxyNode at once: installing
// into a cluster of 10k nodes is 10k creates, which one at a time take
// minutes on a busy API server. Each Node is its own work item, so
// workers never race on one.
const nodeWorkers = 8

// SetupWithManager registers the reconciler: created Nodes (metadata
// only) and deleted ProxyNodes (created again for their Node) map to the
// node of the same name. Node updates (a kubelet's status, labels) and
// ProxyNode creations and updates (the agents' status reports, several
// per switch) cannot leave a Node without its ProxyNode, so they start
// nothing.
func (r *ProxyNodeReconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.Client == nil {
		r.Client = mgr.GetClient()
	}
	noUpdates := predicate.Funcs{UpdateFunc: func(event.UpdateEvent) bool { return false }}
	onlyDeletes := predicate.Funcs{
		CreateFunc:  func(event.CreateEvent) bool { return false },
		UpdateFunc:  func(event.UpdateEvent) bool { return false },
		GenericFunc: func(event.GenericEvent) bool { return false },
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named(NodeControllerName).
		For(&corev1.Node{}, builder.OnlyMetadata, builder.WithPredicates(noUpdates)).
		Watches(&v1alpha1.ProxyNode{}, &handler.EnqueueRequestForObject{}, builder.WithPredicates(onlyDeletes)).
		WithOptions(controller.Options{MaxConcurrentReconciles: nodeWorkers}).
		Complete(r)
}
