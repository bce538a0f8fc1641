package controllers

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
	"github.com/proxyshift/proxyshift/controllers/plan"
	"github.com/proxyshift/proxyshift/internal/text"
)

// ControllerName names the controller, its events' reporting controller and
// its metrics.
const ControllerName = "proxyshift-operator"

// DefaultStatusCoalesce is how often, at most, a status change that only
// moves the node counts is written.
const DefaultStatusCoalesce = time.Second

// warmPage is the page size of the live list of ProxyNodes a config's
// first pass reads.
const warmPage = 500

// expectationTTL bounds how long the reconciler waits for its own write to
// show up in the cache before it plans anyway (the write then fails on its
// resourceVersion if the cache really is stale).
const expectationTTL = 30 * time.Second

// ProxyConfigReconciler reconciles ProxyConfigs: it reads the config, the
// Nodes (metadata only), the ProxyNodes and the Services (trimmed to what
// controllers/findings reads), calls plan.Plan, and writes the
// result: ProxyNode creates and spec updates, the ProxyConfig status, and
// events. It keeps no rollout state of its own; what it keeps in memory
// only avoids acting on a cache older than its own writes and repeating
// NodeUpdated events.
type ProxyConfigReconciler struct {
	// Client reads from the manager's cache and writes to the API server.
	Client client.Client
	// Cache, when set, is the manager's cache: Nodes, ProxyNodes and Services are then
	// read straight from its informers' stores, without copying thousands
	// of objects into a list on every reconcile. Nil reads through Client.
	Cache cache.Cache
	// APIReader reads from the API server directly. It is used once per
	// config after the process starts (or becomes leader) to make sure the
	// cache has caught up with writes made by a previous leader.
	APIReader client.Reader
	// Recorder records events; nil records none.
	Recorder events.EventRecorder
	// Now returns the current time; nil means time.Now.
	Now func() time.Time
	// StatusCoalesce is DefaultStatusCoalesce when zero; negative writes
	// every change at once.
	StatusCoalesce time.Duration
	// KubeProxyDaemonSet is kube-proxy's DaemonSet, whose existence the
	// planner checks (plan.KubeProxy); the zero value: no kube-proxy.
	KubeProxyDaemonSet types.NamespacedName
	// KubeProxyConfigMap and KubeProxyConfigKey are kube-proxy's
	// configuration file, which spec.kubeProxy changes; the zero value:
	// none.
	KubeProxyConfigMap types.NamespacedName
	KubeProxyConfigKey string

	mu            sync.Mutex
	states        map[string]*configState
	total, errors atomic.Int64
}

// configState is the per-config memory described above.
type configState struct {
	uid          types.UID
	warm         bool
	expect       map[string]expectation // by ProxyNode name
	cfgOldRV     string                 // set after a status write until the cache moves past it
	cfgSince     time.Time
	lastStatus   time.Time
	primed       bool
	announced    map[string]string // node -> rollout it was announced as updated for
	reconciles   int64
	statusWrites int64
}

type expectation struct {
	oldRV   string // the cache must move past this resourceVersion
	created bool   // the object must appear
	deleted types.UID
	since   time.Time
}

// Stats are counters for one ProxyConfig since the process started (for the
// benchmark and for debugging).
type Stats struct {
	Reconciles   int64
	StatusWrites int64
}

// Stats returns the counters of one config.
func (r *ProxyConfigReconciler) Stats(name string) Stats {
	r.mu.Lock()
	defer r.mu.Unlock()
	if s := r.states[name]; s != nil {
		return Stats{Reconciles: s.reconciles, StatusWrites: s.statusWrites}
	}
	return Stats{}
}

func (r *ProxyConfigReconciler) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

func (r *ProxyConfigReconciler) state(cfg *v1alpha1.ProxyConfig) *configState {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.states == nil {
		r.states = map[string]*configState{}
	}
	s := r.states[cfg.Name]
	if s == nil || s.uid != cfg.UID {
		s = &configState{uid: cfg.UID, expect: map[string]expectation{}, announced: map[string]string{}}
		r.states[cfg.Name] = s
	}
	s.reconciles++
	return s
}

// Reconcile plans one ProxyConfig and writes the plan.
func (r *ProxyConfigReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	res, err := r.reconcile(ctx, req)
	r.total.Add(1)
	if err != nil && ctx.Err() == nil { // errors from a shutdown are not failures
		r.errors.Add(1)
	}
	return res, err
}

// Totals are the reconciler's counters over all configs.
type Totals struct {
	Reconciles, Errors int64
}

// Totals returns how many reconciles ran and how many returned an error.
func (r *ProxyConfigReconciler) Totals() Totals {
	return Totals{Reconciles: r.total.Load(), Errors: r.errors.Load()}
}

func (r *ProxyConfigReconciler) reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	log := logf.FromContext(ctx)
	cfg := &v1alpha1.ProxyConfig{}
	if err := r.Client.Get(ctx, req.NamespacedName, cfg); err != nil {
		if apierrors.IsNotFound(err) {
			r.mu.Lock()
			delete(r.states, req.Name)
			r.mu.Unlock()
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, err
	}
	if cfg.DeletionTimestamp != nil {
		return ctrl.Result{}, nil
	}
	cs := r.state(cfg)
	now := r.now()

	// Our last status write must be in the cache before we plan on it.
	if cs.cfgOldRV != "" {
		if cfg.ResourceVersion == cs.cfgOldRV && now.Sub(cs.cfgSince) < expectationTTL {
			return ctrl.Result{RequeueAfter: 200 * time.Millisecond}, nil
		}
		cs.cfgOldRV = ""
	}

	var configs v1alpha1.ProxyConfigList
	if err := r.Client.List(ctx, &configs); err != nil {
		return ctrl.Result{}, err
	}
	nodes, pns, err := r.readNodes(ctx)
	if err != nil {
		return ctrl.Result{}, err
	}
	if !cs.warm && r.APIReader != nil {
		// First look since start: expect the cache to reach what the API
		// server holds now, so a previous leader's last writes are seen.
		// Names and resourceVersions are all it needs: a metadata-only
		// list, in pages, so that 10k ProxyNodes never sit in memory
		// twice over as one response (that list was the operator's
		// peak memory at 10k nodes).
		live := &metav1.PartialObjectMetadataList{}
		live.SetGroupVersionKind(v1alpha1.GroupVersion.WithKind("ProxyNodeList"))
		for next := ""; ; {
			if err := r.APIReader.List(ctx, live, client.Limit(warmPage), client.Continue(next)); err != nil {
				return ctrl.Result{}, err
			}
			for i := range live.Items {
				l := &live.Items[i]
				if c := pns[l.Name]; c == nil {
					cs.expect[l.Name] = expectation{created: true, since: now}
				} else if c.ResourceVersion != l.ResourceVersion {
					cs.expect[l.Name] = expectation{oldRV: c.ResourceVersion, since: now}
				}
			}
			if next = live.Continue; next == "" {
				break
			}
		}
		cs.warm = true
	}
	if waiting := cs.unmet(pns, now); waiting != "" {
		log.V(1).Info("waiting for the cache to see our writes", "proxyNode", waiting)
		return ctrl.Result{RequeueAfter: 200 * time.Millisecond}, nil
	}

	kp, err := r.kubeProxy(ctx)
	if err != nil {
		return ctrl.Result{}, err
	}
	svcs, err := r.readServices(ctx)
	if err != nil {
		return ctrl.Result{}, err
	}
	tList := time.Since(now)
	res := plan.Plan(plan.Input{Config: cfg, Others: configs.Items, Nodes: nodes, ProxyNodes: pns, Now: now, KubeProxy: kp, Services: svcs})
	tPlan := time.Since(now) - tList
	defer func() {
		log.V(1).Info("planned", "phase", res.Status.Phase, "updated", res.Status.Nodes.Summary, "create", len(res.Create),
			"update", len(res.Update), "read", tList, "plan", tPlan, "total", time.Since(now))
	}()

	for _, pn := range res.Delete {
		err := r.Client.Delete(ctx, pn, client.Preconditions{UID: &pn.UID, ResourceVersion: &pn.ResourceVersion})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return ctrl.Result{}, fmt.Errorf("delete stale ProxyNode %s: %w", pn.Name, err)
		}
		cs.expect[pn.Name] = expectation{deleted: pn.UID, since: now}
	}
	created := make([]bool, len(res.Create))
	err = parallel(len(res.Create), func(i int) error {
		pn := res.Create[i]
		if err := r.Client.Create(ctx, pn); err != nil {
			if apierrors.IsAlreadyExists(err) {
				return nil
			}
			return fmt.Errorf("create ProxyNode %s: %w", pn.Name, err)
		}
		created[i] = true
		return nil
	})
	for i, ok := range created {
		if ok {
			cs.expect[res.Create[i].Name] = expectation{created: true, since: now}
		}
	}
	if err != nil {
		return ctrl.Result{}, err
	}

	// Status first: a new rollout's start time must be in the API before
	// any node carries its name.
	requeue := res.RequeueAfter
	if !apiequality.Semantic.DeepEqual(cfg.Status, res.Status) {
		coalesce := r.StatusCoalesce
		if coalesce == 0 {
			coalesce = DefaultStatusCoalesce
		}
		wait := time.Duration(0)
		if onlyCounts(&cfg.Status, &res.Status) && coalesce > 0 {
			wait = coalesce - now.Sub(cs.lastStatus)
		}
		if wait > 0 {
			requeue = minPositive(requeue, wait)
		} else {
			oldRV := cfg.ResourceVersion
			upd := cfg.DeepCopy()
			upd.Status = res.Status
			if err := r.Client.Status().Update(ctx, upd); err != nil {
				if apierrors.IsConflict(err) {
					return ctrl.Result{Requeue: true}, nil
				}
				return ctrl.Result{}, fmt.Errorf("update status: %w", err)
			}
			cs.cfgOldRV, cs.cfgSince, cs.lastStatus = oldRV, now, now
			cs.statusWrites++
		}
	}

	if cm := res.KubeProxyConfig; cm != nil {
		// After the status, which names the stage that asks for it.
		if err := r.Client.Update(ctx, cm); err != nil {
			if !apierrors.IsConflict(err) {
				return ctrl.Result{}, fmt.Errorf("update kube-proxy's ConfigMap %s/%s: %w", cm.Namespace, cm.Name, err)
			}
			requeue = minPositive(requeue, time.Second) // the cache was behind; plan again from its next view
		}
	}

	oldRVs := make([]string, len(res.Update))
	written := make([]bool, len(res.Update))
	var stale atomic.Bool
	err = parallel(len(res.Update), func(i int) error {
		pn := res.Update[i]
		oldRVs[i] = pn.ResourceVersion
		if err := r.Client.Update(ctx, pn); err != nil {
			if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
				stale.Store(true) // the cache was behind; its watch event brings us back
				return nil
			}
			return fmt.Errorf("update ProxyNode %s: %w", pn.Name, err)
		}
		written[i] = true
		return nil
	})
	for i, ok := range written {
		if ok {
			cs.expect[res.Update[i].Name] = expectation{oldRV: oldRVs[i], since: now}
		}
	}
	if err != nil {
		return ctrl.Result{}, err
	}
	if stale.Load() {
		requeue = minPositive(requeue, time.Second)
	}

	r.recordEvents(cfg, cs, res, pns)
	return ctrl.Result{RequeueAfter: requeue}, nil
}

// kubeProxy reads what the planner needs of kube-proxy from the cache:
// whether its DaemonSet exists, a --proxy-mode flag in it, the nodes its
// pods are bound to, and its ConfigMap.
func (r *ProxyConfigReconciler) kubeProxy(ctx context.Context) (plan.KubeProxy, error) {
	var kp plan.KubeProxy
	if cm := r.KubeProxyConfigMap; cm.Name != "" {
		kp.ConfigMap = cm.String() + ":" + r.KubeProxyConfigKey
		obj := &corev1.ConfigMap{}
		switch err := r.Client.Get(ctx, cm, obj); {
		case err == nil:
			kp.Config = obj
		case !apierrors.IsNotFound(err):
			return kp, err
		}
	}
	key := r.KubeProxyDaemonSet
	if key.Name == "" {
		return kp, nil
	}
	kp.DaemonSet = key.String()
	ds := &appsv1.DaemonSet{}
	if err := r.Client.Get(ctx, key, ds); apierrors.IsNotFound(err) {
		return kp, nil
	} else if err != nil {
		return kp, err
	}
	kp.Found = true
	kp.ModeFlag = proxyModeFlag(ds)
	sel, err := metav1.LabelSelectorAsSelector(ds.Spec.Selector)
	if err != nil {
		return kp, nil // a DaemonSet the API server accepted has a valid selector
	}
	var pods corev1.PodList
	if err := r.Client.List(ctx, &pods, client.InNamespace(key.Namespace), client.MatchingLabelsSelector{Selector: sel}); err != nil {
		return kp, err
	}
	kp.PodNodes = map[string]bool{}
	for _, p := range pods.Items {
		if p.Spec.NodeName != "" {
			kp.PodNodes[p.Spec.NodeName] = true
		}
	}
	return kp, nil
}

// proxyModeFlag is the value of a --proxy-mode flag in the DaemonSet's
// containers, "" when there is none.
func proxyModeFlag(ds *appsv1.DaemonSet) string {
	for _, c := range ds.Spec.Template.Spec.Containers {
		args := append(append([]string{}, c.Command...), c.Args...)
		for i, a := range args {
			switch {
			case strings.HasPrefix(a, "--proxy-mode="):
				return strings.TrimPrefix(a, "--proxy-mode=")
			case a == "--proxy-mode" && i+1 < len(args):
				return args[i+1]
			}
		}
	}
	return ""
}

// unmet returns a ProxyNode whose expected change the cache does not show
// yet, dropping expectations that are met or too old.
func (cs *configState) unmet(pns map[string]*v1alpha1.ProxyNode, now time.Time) string {
	for name, e := range cs.expect {
		pn := pns[name]
		var met bool
		switch {
		case e.deleted != "":
			met = pn == nil || pn.UID != e.deleted
		case e.created:
			met = pn != nil
		default:
			met = pn == nil || pn.ResourceVersion != e.oldRV
		}
		if met || now.Sub(e.since) > expectationTTL {
			delete(cs.expect, name)
			continue
		}
		return name
	}
	return ""
}

// onlyCounts says whether two statuses differ only in node counts,
// condition messages (which quote the counts), and the objects, counts and
// messages of the same findings (which shrink as nodes move).
func onlyCounts(a, b *v1alpha1.ProxyConfigStatus) bool {
	x, y := a.DeepCopy(), b.DeepCopy()
	x.Nodes, y.Nodes = v1alpha1.NodeCounts{}, v1alpha1.NodeCounts{}
	for _, s := range []*v1alpha1.ProxyConfigStatus{x, y} {
		for i := range s.Conditions {
			s.Conditions[i].Message = ""
		}
		for i := range s.Findings {
			f := &s.Findings[i]
			f.Message, f.Objects, f.Count = "", nil, 0
		}
	}
	return apiequality.Semantic.DeepEqual(x, y)
}

func minPositive(a, b time.Duration) time.Duration {
	if a <= 0 || (b > 0 && b < a) {
		return b
	}
	return a
}

func (r *ProxyConfigReconciler) recordEvents(cfg *v1alpha1.ProxyConfig, cs *configState, res plan.Result, pns map[string]*v1alpha1.ProxyNode) {
	// NodeUpdated: one event per pass naming the nodes newly updated. The
	// first pass after start only learns what is already updated.
	var fresh []string
	for _, name := range res.Updated {
		key := ""
		if pn := pns[name]; pn != nil {
			key = pn.Annotations[plan.AnnotationRollout]
			if pn.Spec.ConfigRef != nil {
				key += fmt.Sprintf("/%d", pn.Spec.ConfigRef.Generation)
			}
		}
		if cs.announced[name] != key {
			cs.announced[name] = key
			if cs.primed {
				fresh = append(fresh, name)
			}
		}
	}
	cs.primed = true
	if r.Recorder == nil {
		return
	}
	for _, e := range res.Events {
		typ := corev1.EventTypeNormal
		if e.Warning {
			typ = corev1.EventTypeWarning
		}
		r.Recorder.Eventf(cfg, relatedProxyNode(e.Node), typ, e.Reason, "Rollout", "%s", truncateNote(e.Message))
	}
	if len(fresh) > 0 {
		sort.Strings(fresh)
		shown := fresh
		more := ""
		if len(shown) > 10 {
			shown, more = shown[:10], fmt.Sprintf(" and %d more", len(fresh)-10)
		}
		r.Recorder.Eventf(cfg, relatedProxyNode(fresh[0]), corev1.EventTypeNormal, plan.EventNodeUpdated, "Rollout",
			"%s%s now run %s (%s updated)", strings.Join(shown, ", "), more, res.Status.TargetMode, res.Status.Nodes.Summary)
	}
}

func relatedProxyNode(name string) runtime.Object {
	if name == "" {
		return nil // an untyped nil: no related object
	}
	return &v1alpha1.ProxyNode{
		TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: "ProxyNode"},
		ObjectMeta: metav1.ObjectMeta{Name: name},
	}
}

func truncateNote(s string) string {
	return text.Cut(s, 1000) // events.k8s.io notes are limited to 1 kB
}

// writeConcurrency bounds the ProxyNode writes one reconcile has in flight.
const writeConcurrency = 16

// parallel runs f(0..n-1) with at most writeConcurrency at once and
// returns the first error. The writes of one plan are independent: the
// plan already fits them all within maxUnavailable.
func parallel(n int, f func(i int) error) error {
	if n == 0 {
		return nil
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	sem := make(chan struct{}, writeConcurrency)
	for i := 0; i < n; i++ {
		wg.Add(1)
		sem <- struct{}{}
		go func(i int) {
			defer func() { <-sem; wg.Done() }()
			if err := f(i); err != nil {
				mu.Lock()
				if first == nil {
					first = err
				}
				mu.Unlock()
			}
		}(i)
	}
	wg.Wait()
	return first
}

// storeGetter is the part of a client-go informer that gives its store.
type storeGetter interface {
	GetStore() toolscache.Store
}

// cached returns the objects the cache's informer for obj's kind holds,
// without copying them: the cache's own objects, to read and never change.
// ok is false without a cache or when its informer has no store; the
// caller then lists through its client.
func cached(ctx context.Context, c cache.Cache, obj client.Object) (objs []any, ok bool) {
	if c == nil {
		return nil, false
	}
	inf, err := c.GetInformer(ctx, obj)
	if err != nil {
		return nil, false
	}
	sg, ok := inf.(storeGetter)
	if !ok {
		return nil, false
	}
	return sg.GetStore().List(), true
}

// nodeMetadata is the kind of the Node informer: metadata only.
func nodeMetadata() *metav1.PartialObjectMetadata {
	m := &metav1.PartialObjectMetadata{}
	m.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Node"))
	return m
}

// cachedProxyNodes is cached for ProxyNodes, by name.
func cachedProxyNodes(ctx context.Context, c cache.Cache) (map[string]*v1alpha1.ProxyNode, bool) {
	objs, ok := cached(ctx, c, &v1alpha1.ProxyNode{})
	if !ok {
		return nil, false
	}
	pns := make(map[string]*v1alpha1.ProxyNode, len(objs))
	for _, o := range objs {
		if pn, ok := o.(*v1alpha1.ProxyNode); ok {
			pns[pn.Name] = pn
		}
	}
	return pns, true
}

// readNodes returns every Node (as plan.Nodes) and every ProxyNode by name.
// The ProxyNodes are the cache's own objects: read them, never change them.
func (r *ProxyConfigReconciler) readNodes(ctx context.Context) ([]plan.Node, map[string]*v1alpha1.ProxyNode, error) {
	objs, ok1 := cached(ctx, r.Cache, nodeMetadata())
	pns, ok2 := cachedProxyNodes(ctx, r.Cache)
	if ok1 && ok2 {
		nodes := make([]plan.Node, 0, len(objs))
		for _, o := range objs {
			if n, ok := o.(*metav1.PartialObjectMetadata); ok {
				nodes = append(nodes, plan.Node{Name: n.Name, UID: n.UID, Labels: n.Labels, Deleting: n.DeletionTimestamp != nil})
			}
		}
		return nodes, pns, nil
	}
	var nodeList metav1.PartialObjectMetadataList
	nodeList.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("NodeList"))
	if err := r.Client.List(ctx, &nodeList, client.UnsafeDisableDeepCopy); err != nil {
		return nil, nil, err
	}
	nodes := make([]plan.Node, 0, len(nodeList.Items))
	for i := range nodeList.Items {
		n := &nodeList.Items[i]
		nodes = append(nodes, plan.Node{Name: n.Name, UID: n.UID, Labels: n.Labels, Deleting: n.DeletionTimestamp != nil})
	}
	var pnList v1alpha1.ProxyNodeList
	if err := r.Client.List(ctx, &pnList, client.UnsafeDisableDeepCopy); err != nil {
		return nil, nil, err
	}
	pns = make(map[string]*v1alpha1.ProxyNode, len(pnList.Items))
	for i := range pnList.Items {
		pns[pnList.Items[i].Name] = &pnList.Items[i]
	}
	return nodes, pns, nil
}

// readServices returns every Service, as the cache's transform trimmed
// them (findings.Trim). They are the cache's own objects: read them, never
// change them.
func (r *ProxyConfigReconciler) readServices(ctx context.Context) ([]*corev1.Service, error) {
	if objs, ok := cached(ctx, r.Cache, &corev1.Service{}); ok {
		out := make([]*corev1.Service, 0, len(objs))
		for _, o := range objs {
			if svc, ok := o.(*corev1.Service); ok {
				out = append(out, svc)
			}
		}
		return out, nil
	}
	var l corev1.ServiceList
	if err := r.Client.List(ctx, &l, client.UnsafeDisableDeepCopy); err != nil {
		return nil, err
	}
	out := make([]*corev1.Service, len(l.Items))
	for i := range l.Items {
		out[i] = &l.Items[i]
	}
	return out, nil
}
