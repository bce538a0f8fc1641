package report

import (
	"context"
	"fmt"
	"sync"
	"time"

	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/proxyshift/proxyshift/api/contract"
	"github.com/proxyshift/proxyshift/api/v1alpha1"
	"github.com/proxyshift/proxyshift/internal/text"
	"github.com/proxyshift/proxyshift/nodeagent/dataplane"
)

// Switch is the switcher's side of the status.
type Switch struct {
	// Phase is the phase that is starting (or reached).
	Phase v1alpha1.NodePhase
	// Active is the mode known to serve: the previous mode until a
	// switch completes.
	Active v1alpha1.ProxyMode
	// Target is the mode being switched to.
	Target v1alpha1.ProxyMode
	// Config and Generation are the spec acted on: its configRef and the
	// ProxyNode's metadata.generation. Config is written to
	// status.observedConfig when a switch ends (Active or Failed), so the
	// operator never reads an unfinished switch as done.
	Config     *v1alpha1.ConfigReference
	Generation int64
	// Reason and Message say why the switch failed (Phase Failed).
	Reason, Message string
	// Settings are the settings Active runs with (status.activeSettings;
	// nil when nothing of proxyshift's serves, or they are not known).
	Settings *v1alpha1.ProxySettings
	// KubeProxyMode is the mode of kube-proxy's objects in the kernel
	// ("" none).
	KubeProxyMode v1alpha1.ProxyMode
	// Warning, if set, makes Degraded true with this reason and message
	// although the switch succeeded (kube-proxy's leftovers could not be
	// removed).
	WarningReason, WarningMessage string
}

// Sync is the outcome of one sync of the serving backend.
type Sync struct {
	Time     time.Time
	Duration time.Duration
	Counts   dataplane.Counts
	Err      error
	// Warning is what a sync that succeeded left alone
	// (dataplane.Warning): Degraded with ReasonForeignObjects.
	Warning error
}

// Reporter writes one ProxyNode's status. Its methods only record and
// signal; Run does the writing.
type Reporter struct {
	c    *Client
	node string
	// SyncEvery bounds how often status is written when only the last
	// sync's time and duration changed.
	SyncEvery time.Duration

	// writing, a token, serializes writes (Run's and Flush's): a write
	// reads what the last one wrote, so the same status is not sent twice
	// (Flush's and the write SetSwitch signals to Run), and an older
	// status never lands after a newer one. A write waits for the token
	// within its context only: an unreachable API server does not hold a
	// Flush past its bound.
	writing chan struct{}

	mu      sync.Mutex
	sw      Switch
	sync    *Sync
	kernel  *v1alpha1.KernelFacts
	problem problem
	written *v1alpha1.ProxyNodeStatus
	base    *v1alpha1.ProxyNodeStatus // status as read at start
	// uid is the ProxyNode written and base are the status of ("" not
	// known). A ProxyNode recreated under the same name has a new UID and
	// none of that status.
	uid    types.UID
	lastAt time.Time
	kick   chan struct{}
	// renewed receives when another ProxyNode appears (Observe): Run
	// writes to it at once, whatever the backoff its failed writes to the
	// old one (gone: not found) had reached.
	renewed chan struct{}
}

// New returns a Reporter for node. c may be nil: then nothing is written
// (a standalone agent).
func New(c *Client, node string) *Reporter {
	return &Reporter{c: c, node: node, SyncEvery: time.Minute, kick: make(chan struct{}, 1), renewed: make(chan struct{}, 1), writing: make(chan struct{}, 1)}
}

// Seed starts the Reporter from the status pn has (nil: none), so
// conditions keep their transition times across agent restarts. What was
// written before (a startup problem) is forgotten: pn shows it already.
func (r *Reporter) Seed(pn *v1alpha1.ProxyNode) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.written = nil
	if pn == nil {
		r.uid = ""
		return
	}
	r.base, r.uid = pn.Status.DeepCopy(), pn.UID
	if pn.Status.Kernel != nil && r.kernel == nil {
		r.kernel = pn.Status.Kernel.DeepCopy()
	}
}

// Observe tells the Reporter which ProxyNode the API server holds now
// (nil: none), as an informer sees it. A ProxyNode other than the one the
// Reporter wrote to (deleted, or recreated with a new UID) has none of
// the status written: the Reporter forgets it and writes the whole
// status at once. Waiting would not do: a status that does not change is
// not written again, and a change is sent as a difference from the status
// the old ProxyNode held.
func (r *Reporter) Observe(pn *v1alpha1.ProxyNode) {
	var uid types.UID
	if pn != nil {
		uid = pn.UID
	}
	r.mu.Lock()
	if uid == r.uid {
		r.mu.Unlock()
		return
	}
	// A ProxyNode gone takes no write. Nothing written or read before (an
	// agent starting) is nothing the new one lacks: the status is written
	// when there is one.
	tell := uid != "" && (r.written != nil || r.base != nil || !r.lastAt.IsZero())
	r.forget(uid)
	r.mu.Unlock()
	if tell {
		select {
		case r.renewed <- struct{}{}:
		default:
		}
		r.signal()
	}
}

// Follow is the event handler that tells the Reporter of every change of
// its ProxyNode an informer sees (Observe).
func (r *Reporter) Follow() cache.ResourceEventHandler {
	observe := func(obj any) {
		pn, _ := obj.(*v1alpha1.ProxyNode)
		r.Observe(pn)
	}
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    observe,
		UpdateFunc: func(_, obj any) { observe(obj) },
		DeleteFunc: func(any) { r.Observe(nil) },
	}
}

// forget drops what the Reporter believes its ProxyNode holds; that
// ProxyNode is now the one with uid ("" none). The next write sends the
// whole status. r.mu is held.
func (r *Reporter) forget(uid types.UID) {
	r.written, r.base, r.uid = nil, nil, uid
}

// SetProblem makes Degraded true with reason and message, whatever the
// switch says (a failed switch excepted, which is reported as such): the
// agent cannot follow its spec or the API (its informers have not
// synced, the spec's settings do not resolve on this node) and keeps the
// rules the kernel holds. An empty reason clears it.
func (r *Reporter) SetProblem(reason, message string) {
	r.mu.Lock()
	same := r.problem == problem{reason, message}
	r.problem = problem{reason, message}
	r.mu.Unlock()
	if !same {
		r.signal()
	}
}

// problem is what SetProblem recorded.
type problem struct{ reason, message string }

// SetSwitch records the switch's state.
func (r *Reporter) SetSwitch(s Switch) {
	r.mu.Lock()
	r.sw = s
	r.mu.Unlock()
	r.signal()
}

// SetSync records the outcome of a sync.
func (r *Reporter) SetSync(s Sync) {
	r.mu.Lock()
	if s.Err != nil && r.sync != nil {
		// Keep the last good sync's figures; only the error is new.
		prev := *r.sync
		prev.Err = s.Err
		s = prev
	}
	r.sync = &s
	r.mu.Unlock()
	r.signal()
}

// SetKernel records the kernel facts; ReportedTime changes only when the
// facts do.
func (r *Reporter) SetKernel(k v1alpha1.KernelFacts) {
	r.mu.Lock()
	if r.kernel != nil {
		old := r.kernel.DeepCopy()
		old.ReportedTime = nil
		if apiequality.Semantic.DeepEqual(*old, k) {
			r.mu.Unlock()
			return
		}
	}
	now := metav1.Now()
	k.ReportedTime = &now
	r.kernel = &k
	r.mu.Unlock()
	r.signal()
}

func (r *Reporter) signal() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// Status is what the status would be now.
func (r *Reporter) Status() v1alpha1.ProxyNodeStatus {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.build()
}

func (r *Reporter) build() v1alpha1.ProxyNodeStatus {
	var st v1alpha1.ProxyNodeStatus
	if r.written != nil {
		st = *r.written.DeepCopy()
	} else if r.base != nil {
		st = *r.base.DeepCopy()
	}
	sw := r.sw
	if sw.Phase != "" {
		st.Phase = sw.Phase
		st.ActiveMode = sw.Active
		st.ActiveSettings = sw.Settings.DeepCopy()
		st.KubeProxyMode = sw.KubeProxyMode
		if sw.Phase == v1alpha1.NodeActive || sw.Phase == v1alpha1.NodeFailed {
			st.ObservedConfig = sw.Config.DeepCopy()
		}
	}
	if r.kernel != nil {
		st.Kernel = r.kernel.DeepCopy()
	}
	if s := r.sync; s != nil && !s.Time.IsZero() {
		t := metav1.NewTime(s.Time)
		st.LastSyncTime = &t
		st.LastSyncDuration = &metav1.Duration{Duration: s.Duration}
		st.Counts = &v1alpha1.RuleCounts{Services: int32(s.Counts.Services), Endpoints: int32(s.Counts.Endpoints), Rules: int32(s.Counts.Rules)}
	}
	var set []metav1.Condition
	if sw.Phase != "" {
		ready, degraded := conditions(sw, r.sync)
		set = append(set, ready, degraded)
	}
	if p := r.problem; p.reason != "" && sw.Phase != v1alpha1.NodeFailed {
		set = append(set, metav1.Condition{Type: contract.ConditionDegraded, Status: metav1.ConditionTrue, Reason: p.reason, Message: p.message})
	}
	for _, c := range set {
		// A message the API server refuses would freeze the status.
		c.Message = text.Cut(c.Message, text.MaxMessage)
		c.ObservedGeneration = sw.Generation
		meta.SetStatusCondition(&st.Conditions, c)
	}
	return st
}

// conditions derives Ready and Degraded.
func conditions(sw Switch, s *Sync) (ready, degraded metav1.Condition) {
	ready = metav1.Condition{Type: contract.ConditionReady}
	degraded = metav1.Condition{Type: contract.ConditionDegraded, Status: metav1.ConditionFalse, Reason: contract.ReasonAsExpected, Message: "nothing to report"}
	syncErr := s != nil && s.Err != nil
	switch sw.Phase {
	case v1alpha1.NodeActive:
		if syncErr {
			ready.Status, ready.Reason = metav1.ConditionFalse, contract.ReasonSyncFailed
			ready.Message = fmt.Sprintf("%s serves, but its last sync failed (the kernel keeps the last good rules): %v", sw.Active, s.Err)
		} else {
			ready.Status, ready.Reason = metav1.ConditionTrue, contract.ReasonActive
			ready.Message = fmt.Sprintf("%s serves and its rules are synced", sw.Active)
		}
	case v1alpha1.NodeFailed:
		ready.Status, ready.Reason = metav1.ConditionFalse, sw.Reason
		ready.Message = sw.Message
		degraded.Status, degraded.Reason, degraded.Message = metav1.ConditionTrue, sw.Reason, sw.Message
	case v1alpha1.NodeIdle:
		ready.Status, ready.Reason = metav1.ConditionFalse, contract.ReasonNoMode
		ready.Message = "no mode is desired (spec.desiredMode is empty) and none is programmed"
		if sw.Active == v1alpha1.ModeKubeProxy {
			ready.Message = fmt.Sprintf("kube-proxy serves this node (its %s rules are in the kernel); no mode is desired of proxyshift (spec.desiredMode is empty)", sw.KubeProxyMode)
		}
	case v1alpha1.NodeWaitingForKubeProxy:
		ready.Status, ready.Reason = metav1.ConditionFalse, contract.ReasonSwitching
		if sw.Target == v1alpha1.ModeKubeProxy {
			ready.Message = fmt.Sprintf("handing the node back: %s keeps serving until kube-proxy's pod is back on the node and has synced its rules", sw.Active)
		} else {
			ready.Message = fmt.Sprintf("taking the node over: %s is programmed and verified; waiting for kube-proxy's pod to leave the node before removing its rules", sw.Target)
		}
	default:
		ready.Status, ready.Reason = metav1.ConditionFalse, contract.ReasonSwitching
		from := string(sw.Active)
		if from == "" {
			from = "no mode"
		}
		ready.Message = fmt.Sprintf("switching from %s to %s: %s", from, sw.Target, sw.Phase)
	}
	if ready.Reason == "" {
		ready.Reason = "Unknown"
	}
	if sw.Phase != v1alpha1.NodeFailed {
		switch {
		case sw.WarningReason != "":
			degraded.Status, degraded.Reason, degraded.Message = metav1.ConditionTrue, sw.WarningReason, sw.WarningMessage
		case syncErr:
			degraded.Status, degraded.Reason = metav1.ConditionTrue, contract.ReasonSyncFailed
			degraded.Message = fmt.Sprintf("the last sync failed (the kernel keeps the last good rules): %v", s.Err)
		case s != nil && s.Warning != nil && onlyMissingFamilies(s.Warning):
			degraded.Status, degraded.Reason = metav1.ConditionTrue, contract.ReasonFamilyMissing
			degraded.Message = fmt.Sprintf("the last sync programmed every IP family the node has, and no Service port of a family it lacks: %v", s.Warning)
		case s != nil && s.Warning != nil:
			degraded.Status, degraded.Reason = metav1.ConditionTrue, contract.ReasonForeignObjects
			degraded.Message = fmt.Sprintf("the last sync programmed everything but what another program holds, left alone: %v", s.Warning)
		}
	}
	return ready, degraded
}

// Run writes the status whenever it changed, until ctx ends. A write
// that only updates the last sync's time waits for SyncEvery. Failed
// writes are retried with backoff.
func (r *Reporter) Run(ctx context.Context) {
	if r.c == nil {
		return
	}
	backoff := time.Duration(0)
	tick := time.NewTicker(5 * time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.kick:
		case <-tick.C:
		}
		if backoff > 0 {
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			case <-r.renewed:
				backoff = 0
			}
		}
		if err := r.write(ctx, false); err != nil {
			backoff = min(max(2*backoff, 500*time.Millisecond), 30*time.Second)
			if !apierrors.IsNotFound(err) {
				klog.ErrorS(err, "Could not write ProxyNode status; retrying", "proxynode", r.node, "retryIn", backoff)
			}
			r.signal()
			continue
		}
		backoff = 0
		select {
		case <-r.renewed: // written already
		default:
		}
	}
}

// Flush writes the status now if it changed, within ctx.
func (r *Reporter) Flush(ctx context.Context) error {
	if r.c == nil {
		return nil
	}
	return r.write(ctx, true)
}

// write patches the status if it differs from what was last written.
// Only the last sync's time and duration changing is written at most every
// SyncEvery, unless force.
func (r *Reporter) write(ctx context.Context, force bool) error {
	select {
	case r.writing <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-r.writing }()
	r.mu.Lock()
	st := r.build()
	written := r.written
	prev := written
	if prev == nil {
		prev = r.base
	}
	started := r.uid
	due := force || time.Since(r.lastAt) >= r.SyncEvery
	r.mu.Unlock()
	if written != nil {
		if apiequality.Semantic.DeepEqual(*written, st) {
			return nil
		}
		if !due && sameButSyncTime(*written, st) {
			return nil
		}
	}
	patched, err := r.c.PatchStatus(ctx, r.node, prev, &st)
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		if apierrors.IsNotFound(err) {
			// Whatever ProxyNode comes next holds none of it.
			r.forget("")
		}
		return err
	}
	switch judgeWrite(started, patched, r.uid) {
	case writeRecorded:
		r.written, r.uid = &st, patched
		r.lastAt = time.Now()
	case writeLandedElsewhere:
		r.forget(patched)
		r.signal()
	case writeOutdated:
		r.signal()
	}
	return nil
}

// writeOutcome is what a write the API server took tells the Reporter.
type writeOutcome int

const (
	// writeRecorded: the ProxyNode holds the status written.
	writeRecorded writeOutcome = iota
	// writeLandedElsewhere: the difference from one ProxyNode's status
	// was applied to another (recreated) ProxyNode, which holds only a
	// part of the status.
	writeLandedElsewhere
	// writeOutdated: while the write was under way the Reporter learned
	// of another ProxyNode (Observe), and forgot the status for it; that
	// stands.
	writeOutdated
)

// judgeWrite judges a write that started believing the ProxyNode was the
// one with UID started ("" not known: the whole status was sent), that
// patched the one with UID patched, and after which the Reporter believes
// it is the one with UID now.
func judgeWrite(started, patched, now types.UID) writeOutcome {
	switch {
	case started != "" && patched != started:
		return writeLandedElsewhere
	case now != started && now != patched:
		return writeOutdated
	}
	return writeRecorded
}

// sameButSyncTime says whether a and b differ only in the last sync's
// time and duration.
func sameButSyncTime(a, b v1alpha1.ProxyNodeStatus) bool {
	a.LastSyncTime, b.LastSyncTime = nil, nil
	a.LastSyncDuration, b.LastSyncDuration = nil, nil
	return apiequality.Semantic.DeepEqual(a, b)
}

// onlyMissingFamilies says whether every warning in err is a
// *dataplane.FamilyMissingError.
func onlyMissingFamilies(err error) bool {
	warnings, _ := dataplane.SplitWarnings(err)
	for _, w := range warnings {
		if _, ok := w.(*dataplane.FamilyMissingError); !ok {
			return false
		}
	}
	return len(warnings) > 0
}
