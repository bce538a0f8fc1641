package netlab

import (
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// ClientLoop opens new TCP connections from one namespace, one after the
// other (10 ms apart), to each target in turn, until stopped: the traffic
// a switch test keeps going while the rules underneath it change.
type ClientLoop struct {
	stop, done chan struct{}
	once       sync.Once
	ok, fail   atomic.Int64
	mu         sync.Mutex
	errs       []string // the first few failures
}

// StartClientLoop starts the loop from ns; the test stops it with
// RequireNoFailures, or it stops when the test ends.
func StartClientLoop(t testing.TB, ns *NetNS, targets ...netip.AddrPort) *ClientLoop {
	return StartClientLoopEvery(t, ns, 10*time.Millisecond, targets...)
}

// StartClientLoopEvery is StartClientLoop with pause between two
// connections instead of 10 ms.
func StartClientLoopEvery(t testing.TB, ns *NetNS, pause time.Duration, targets ...netip.AddrPort) *ClientLoop {
	return StartClientLoopTimeout(t, ns, pause, 2*time.Second, targets...)
}

// StartClientLoopTimeout is StartClientLoopEvery with timeout for each
// connection instead of 2 s (for emulated machines, whose stalls on a busy
// host outlast 2 s).
func StartClientLoopTimeout(t testing.TB, ns *NetNS, pause, timeout time.Duration, targets ...netip.AddrPort) *ClientLoop {
	l := &ClientLoop{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(l.done)
		for i := 0; ; i++ {
			select {
			case <-l.stop:
				return
			default:
			}
			target := targets[i%len(targets)]
			if _, err := ns.Request(TCP, target, timeout); err != nil {
				l.fail.Add(1)
				l.mu.Lock()
				if len(l.errs) < 10 {
					l.errs = append(l.errs, fmt.Sprintf("%s %s: %v", time.Now().Format("15:04:05.000"), target, err))
				}
				l.mu.Unlock()
			} else {
				l.ok.Add(1)
			}
			time.Sleep(pause)
		}
	}()
	t.Cleanup(l.Stop)
	return l
}

// Counts are the connections answered and failed so far.
func (l *ClientLoop) Counts() (ok, failed int64) { return l.ok.Load(), l.fail.Load() }

// Errors are the first few failures, described.
func (l *ClientLoop) Errors() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.errs)
}

// Stop ends the loop and waits for its last connection.
func (l *ClientLoop) Stop() {
	l.once.Do(func() { close(l.stop) })
	<-l.done
}

// RequireNoFailures stops the loop and fails the test if a connection
// failed or none was made.
func (l *ClientLoop) RequireNoFailures(t testing.TB, what string) {
	t.Helper()
	l.Stop()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.fail.Load() > 0 || l.ok.Load() == 0 {
		t.Errorf("%s: %d new connections answered, %d failed: %v", what, l.ok.Load(), l.fail.Load(), l.errs)
	} else {
		t.Logf("%s: %d new connections, none failed", what, l.ok.Load())
	}
}
