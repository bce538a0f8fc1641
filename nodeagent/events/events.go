// Package events tells people what the agent does to its node, as
// Kubernetes Events (events.k8s.io/v1) about the node's ProxyNode, with
// the Node as the related object: each phase of a switch as it starts,
// each failure, what a cleanup removed, and the steps of taking a node
// over from kube-proxy and handing it back. The events of cluster-scoped
// objects live in the namespace default, so
//
//	kubectl get events -n default --field-selector involvedObject.kind=ProxyNode,involvedObject.name=NODE
//
// tells the story of a switch, and `kubectl describe proxynode NODE` shows
// it too.
//
// Why a package of its own: the status (package report) says where the
// node stands now and is written by one writer that may lose nothing;
// events say how it got there, are best effort, and must never flood the
// API server however often a node flaps. Two things bound them: the
// events broadcaster of client-go folds repeats of an event (same reason,
// action and object) within six minutes into one object with a count,
// and a token bucket here drops whatever exceeds a burst and then one
// event per interval, saying in the log how many it dropped.
package events

import (
	"context"
	"sync"
	"time"

	"golang.org/x/time/rate"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
	"github.com/proxyshift/proxyshift/internal/text"
)

// Controller is the events' reportingController.
const Controller = "network.proxyshift.io/agent"

// maxNote is the API server's limit on an event's note (message).
const maxNote = 1024

// Defaults of the bound: a switch tells about ten events; a burst of 30
// lets a few through at once, then one every 10 seconds.
const (
	DefaultBurst = 30
	DefaultEvery = 10 * time.Second
)

// Recorder records the events of one node's agent.
type Recorder struct {
	rec     events.EventRecorder
	node    string
	uid     func() types.UID
	limiter *rate.Limiter

	mu      sync.Mutex
	dropped int
}

// New starts a Recorder writing through client until ctx ends. uid says
// the ProxyNode's UID as the agent knows it (empty when unknown), so that
// `kubectl describe proxynode` finds the events.
func New(ctx context.Context, client kubernetes.Interface, node string, uid func() types.UID) *Recorder {
	b := events.NewBroadcaster(&events.EventSinkImpl{Interface: client.EventsV1()})
	b.StartRecordingToSink(ctx.Done())
	go func() {
		<-ctx.Done()
		b.Shutdown()
	}()
	return newRecorder(b.NewRecorder(scheme.Scheme, Controller), node, uid, DefaultBurst, DefaultEvery)
}

func newRecorder(rec events.EventRecorder, node string, uid func() types.UID, burst int, every time.Duration) *Recorder {
	return &Recorder{rec: rec, node: node, uid: uid, limiter: rate.NewLimiter(rate.Every(every), burst)}
}

// Normal records a Normal event: reason is what happened (a phase's name,
// say), action what the agent was doing (the switch and its target).
func (r *Recorder) Normal(reason, action, message string) {
	r.record(corev1.EventTypeNormal, reason, action, message)
}

// Warning records a Warning event.
func (r *Recorder) Warning(reason, action, message string) {
	r.record(corev1.EventTypeWarning, reason, action, message)
}

func (r *Recorder) record(typ, reason, action, message string) {
	if !r.limiter.Allow() {
		r.mu.Lock()
		r.dropped++
		n := r.dropped
		r.mu.Unlock()
		klog.V(2).InfoS("Too many events: dropped one", "reason", reason, "message", message, "droppedSoFar", n)
		return
	}
	var uid types.UID
	if r.uid != nil {
		uid = r.uid()
	}
	regarding := &corev1.ObjectReference{APIVersion: v1alpha1.GroupVersion.String(), Kind: "ProxyNode", Name: r.node, UID: uid}
	related := &corev1.ObjectReference{APIVersion: "v1", Kind: "Node", Name: r.node}
	r.rec.Eventf(regarding, related, typ, reason, action, "%s", text.Cut(message, maxNote))
}
