package agent

// A start that cannot take the node down. The kernel holds the rules the
// previous agent programmed; nothing at start may remove them or make the
// kubelet kill the agent in a loop. So /livez answers before anything
// else is tried, a listen that fails is retried, the informers are waited
// for as long as it takes (reported as Degraded once that is long), and
// settings that do not resolve on this node (yet) are waited for too.
// Until the first sync the kernel keeps what it has.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/proxyshift/proxyshift/api/contract"
	"github.com/proxyshift/proxyshift/nodeagent/report"
)

// health answers /healthz and /livez. /livez is the process being alive
// and answers from the first moment; /healthz is the rules being synced:
// 503 while the agent starts (saying what it waits for), then the sync
// loop's progress.
type health struct {
	timeout time.Duration

	mu      sync.Mutex
	waiting string
	loops   *loopRunner
}

// wait records what the start waits for; /healthz says it.
func (h *health) wait(what string) {
	h.mu.Lock()
	h.waiting = what
	h.mu.Unlock()
}

// started hands /healthz to the sync loop.
func (h *health) started(loops *loopRunner) {
	h.mu.Lock()
	h.loops, h.waiting = loops, ""
	h.mu.Unlock()
}

func (h *health) healthy() error {
	h.mu.Lock()
	loops, waiting := h.loops, h.waiting
	h.mu.Unlock()
	if loops == nil {
		return errors.New("starting: " + waiting + "; the rules the kernel holds keep serving")
	}
	return loops.healthy(h.timeout)
}

func (h *health) mux() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		if err := h.healthy(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("/livez", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	return mux
}

// serve serves srv until ctx ends. A failed listen (the port is taken, the
// address not there yet) or a failed server is logged and retried with
// backoff, never fatal: the agent's endpoints are not worth a node.
func serve(ctx context.Context, srv *http.Server) {
	stop := context.AfterFunc(ctx, func() { _ = srv.Close() })
	defer stop()
	backoff := 500 * time.Millisecond
	for {
		l, err := net.Listen("tcp", srv.Addr)
		if err == nil {
			err = srv.Serve(l)
			if errors.Is(err, http.ErrServerClosed) {
				return
			}
		}
		klog.ErrorS(err, "Cannot serve; retrying", "address", srv.Addr, "retryIn", backoff)
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 30*time.Second)
	}
}

// informer is one informer the start waits for.
type informer struct {
	name   string
	synced cache.InformerSynced
}

// waitSynced waits until every informer has listed, for as long as it
// takes: the API server may be away, or deny a list, for a while. Past
// grace it reports Degraded (the Reporter writes it as soon as the API
// server takes it) and says so on /healthz. It returns false when ctx
// ends first.
func waitSynced(ctx context.Context, r *report.Reporter, h *health, grace time.Duration, informers ...informer) bool {
	start := time.Now()
	// Looking is cheap, and every tick between the lists' end and the
	// first sync is start-up time.
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	reported := false
	for {
		var waiting []string
		for _, i := range informers {
			if !i.synced() {
				waiting = append(waiting, i.name)
			}
		}
		if len(waiting) == 0 {
			if reported {
				klog.InfoS("Informers synced", "after", time.Since(start).Round(time.Millisecond))
			}
			r.SetProblem("", "")
			return true
		}
		what := "the first list of " + strings.Join(waiting, ", ")
		h.wait(what)
		if !reported && time.Since(start) >= grace {
			reported = true
			msg := fmt.Sprintf("waiting since %s for %s (the API server is unreachable, slow, or denies the list); the rules the kernel holds keep serving until then",
				start.UTC().Format(time.RFC3339), what)
			klog.InfoS("Informers not synced yet; the kernel's rules keep serving", "waitingFor", waiting, "since", start)
			r.SetProblem(contract.ReasonNotSynced, msg)
		}
		select {
		case <-ctx.Done():
			return false
		case <-tick.C:
		}
	}
}
