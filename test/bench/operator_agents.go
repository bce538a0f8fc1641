package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/proxyshift/proxyshift/api/contract"
	"github.com/proxyshift/proxyshift/api/v1alpha1"
)

// simAgents plays the agent of every simulated node towards the API, and
// only that: no kernel, no Services. Like the real agent
// (nodeagent/report) it merge-patches its node's ProxyNode status: once,
// when the ProxyNode appears, who serves the node (proxyshift in
// Initial mode) with the kernel facts the preflight reads; then, for each
// new spec.configRef, phase Preparing at once and, after SwitchTime
// (plus up to SwitchJitter), phase Active in the desired mode with
// observedConfig set. One list-and-watch of all ProxyNodes stands for the
// real agents' one watch each, and Writers goroutines share the writes;
// the real agent's periodic sync figures (lastSyncTime, counts), which
// the operator ignores, are not written.
type simAgents struct {
	c       client.WithWatch
	initial v1alpha1.ProxyMode
	switchT time.Duration
	jitter  time.Duration

	work   chan func(context.Context)
	mu     sync.Mutex
	acting map[string]v1alpha1.ConfigReference // node -> the spec being switched to
	known  map[string]bool                     // nodes whose first report was sent
	writes atomic.Int64
	errs   atomic.Int64
	ready  atomic.Int64 // nodes whose first report was written
}

// simKernel is what every simulated node reports of its kernel: nf_tables
// and iptables-nft usable, IPVS loadable.
func simKernel() *v1alpha1.KernelFacts {
	return &v1alpha1.KernelFacts{
		Version: "6.12.0",
		Modules: []v1alpha1.KernelModule{
			{Name: contract.IPVSModule, State: v1alpha1.ModuleLoadable},
			{Name: "ip_vs_rr", State: v1alpha1.ModuleLoadable},
			{Name: contract.ConntrackModule, State: v1alpha1.ModuleLoaded},
		},
		NFTables:         v1alpha1.CapabilityYes,
		IPTablesBackends: []v1alpha1.IPTablesBackend{{Name: "nft", Available: v1alpha1.CapabilityYes, HasRules: v1alpha1.CapabilityYes}},
		ReportedTime:     &metav1.Time{Time: time.Now()},
	}
}

func newSimAgents(c client.WithWatch, initial v1alpha1.ProxyMode, switchTime, jitter time.Duration, writers int) *simAgents {
	return &simAgents{c: c, initial: initial, switchT: switchTime, jitter: jitter,
		work: make(chan func(context.Context), writers*4), acting: map[string]v1alpha1.ConfigReference{}, known: map[string]bool{}}
}

// run serves until ctx ends: writers goroutines for the writes, and the
// list-and-watch that decides them. started is closed after the first
// list.
func (a *simAgents) run(ctx context.Context, writers int, started chan<- struct{}) {
	for i := 0; i < writers; i++ {
		go func() {
			for {
				select {
				case f := <-a.work:
					f(ctx)
				case <-ctx.Done():
					return
				}
			}
		}()
	}
	watchAll(ctx, a.c, a.on, started)
}

// on decides what a node's agent does about one state of its ProxyNode.
func (a *simAgents) on(ctx context.Context, pn *v1alpha1.ProxyNode) {
	name := pn.Name
	a.mu.Lock()
	defer a.mu.Unlock()
	if pn.Status.Kernel == nil {
		if a.known[name] {
			return
		}
		a.known[name] = true
		a.submit(ctx, func(ctx context.Context) {
			if a.patch(ctx, name, map[string]any{
				"activeMode": a.initial, "phase": v1alpha1.NodeActive, "kernel": simKernel(),
				"conditions": []metav1.Condition{ready(contract.ReasonActive)},
			}) {
				a.ready.Add(1)
			}
		})
		return
	}
	a.known[name] = true
	ref := pn.Spec.ConfigRef
	if pn.Spec.DesiredMode == "" || ref == nil || (pn.Status.ObservedConfig != nil && *pn.Status.ObservedConfig == *ref) {
		return
	}
	if cur, ok := a.acting[name]; ok && cur == *ref {
		return
	}
	a.acting[name] = *ref
	mode, want := pn.Spec.DesiredMode, *ref
	a.submit(ctx, func(ctx context.Context) {
		a.patch(ctx, name, map[string]any{"phase": v1alpha1.NodePreparing,
			"conditions": []metav1.Condition{ready(contract.ReasonSwitching)}})
		d := a.switchT
		if a.jitter > 0 {
			d += time.Duration(rand.Int64N(int64(a.jitter)))
		}
		time.AfterFunc(d, func() {
			a.submit(ctx, func(ctx context.Context) {
				a.mu.Lock()
				current := a.acting[name] == want
				a.mu.Unlock()
				if !current {
					return // a newer spec came meanwhile; its switch reports
				}
				a.patch(ctx, name, map[string]any{"phase": v1alpha1.NodeActive, "activeMode": mode, "observedConfig": want,
					"conditions": []metav1.Condition{ready(contract.ReasonActive)}})
			})
		})
	})
}

// submit queues a write without blocking the watch for long: a full
// queue is served by a goroutine of its own.
func (a *simAgents) submit(ctx context.Context, f func(context.Context)) {
	select {
	case a.work <- f:
	default:
		go func() {
			select {
			case a.work <- f:
			case <-ctx.Done():
			}
		}()
	}
}

func ready(reason string) metav1.Condition {
	return metav1.Condition{Type: contract.ConditionReady, Status: metav1.ConditionTrue, Reason: reason,
		LastTransitionTime: metav1.Now()}
}

// patch merge-patches these status fields, retrying a few times on
// errors (the API server is busy at 10k nodes).
func (a *simAgents) patch(ctx context.Context, node string, status map[string]any) bool {
	body, err := json.Marshal(map[string]any{"status": status})
	if err != nil {
		panic(err) // the fields are ours and always encode
	}
	pn := &v1alpha1.ProxyNode{}
	pn.Name = node
	for try := 0; try < 5 && ctx.Err() == nil; try++ {
		if err = a.c.Status().Patch(ctx, pn, client.RawPatch(types.MergePatchType, body)); err == nil {
			a.writes.Add(1)
			return true
		}
		time.Sleep(time.Duration(try+1) * 200 * time.Millisecond)
	}
	if ctx.Err() == nil {
		a.errs.Add(1)
	}
	return false
}

// watchAll calls f for every ProxyNode's state, in order: a list, then a
// watch from its resourceVersion, listed again when the watch expires.
// started is closed after the first list.
func watchAll(ctx context.Context, c client.WithWatch, f func(context.Context, *v1alpha1.ProxyNode), started chan<- struct{}) {
	rv := ""
	for ctx.Err() == nil {
		if rv == "" {
			var l v1alpha1.ProxyNodeList
			if err := c.List(ctx, &l); err != nil {
				time.Sleep(200 * time.Millisecond)
				continue
			}
			for i := range l.Items {
				f(ctx, &l.Items[i])
			}
			rv = l.ResourceVersion
			if started != nil {
				close(started)
				started = nil
			}
		}
		w, err := c.Watch(ctx, &v1alpha1.ProxyNodeList{}, &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: rv, AllowWatchBookmarks: true}})
		if err != nil {
			time.Sleep(200 * time.Millisecond)
			continue
		}
		for ev := range w.ResultChan() {
			if ev.Type == watch.Error {
				rv = ""
				break
			}
			pn, ok := ev.Object.(*v1alpha1.ProxyNode)
			if !ok {
				continue
			}
			rv = pn.ResourceVersion
			if ev.Type == watch.Added || ev.Type == watch.Modified {
				f(ctx, pn)
			}
		}
		w.Stop()
	}
}

// String says what the agents did, for the log.
func (a *simAgents) String() string {
	return fmt.Sprintf("%d status writes, %d given up", a.writes.Load(), a.errs.Load())
}
