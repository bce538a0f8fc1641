package agent_test

import (
	"context"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
	"github.com/proxyshift/proxyshift/nodeagent/report"
	"github.com/proxyshift/proxyshift/test/testenv"
)

// roundTripFunc is an http.RoundTripper of a function.
type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }

// TestStatusWritesDoNotOverlap holds the reporter's Run's write of a switch phase in flight
// (on its way to a real API server) while the switcher flushes: the same
// status must not be sent a second time (every phase of a switch was
// written twice, which spent the client's rate limit and made later
// phases wait), and a newer status must land after the one in flight,
// never before it (the API server would be left showing the older
// phase).
func TestStatusWritesDoNotOverlap(t *testing.T) {
	env := testenv.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for _, tc := range []struct {
		name string
		// newer is the phase set while the first write is in flight
		// ("" sets nothing).
		newer       v1alpha1.NodePhase
		wantPatches int32
		wantPhase   v1alpha1.NodePhase
	}{
		{name: "the same status", wantPatches: 1, wantPhase: v1alpha1.NodePreparing},
		{name: "a newer status", newer: v1alpha1.NodeProgramming, wantPatches: 2, wantPhase: v1alpha1.NodeProgramming},
	} {
		t.Run(tc.name, func(t *testing.T) {
			node := "writes-" + map[bool]string{true: "newer", false: "same"}[tc.newer != ""]
			if err := env.Client.Create(ctx, &v1alpha1.ProxyNode{ObjectMeta: metav1.ObjectMeta{Name: node}}); err != nil {
				t.Fatal(err)
			}
			var patches atomic.Int32
			inFlight, second, release := make(chan struct{}), make(chan struct{}), make(chan struct{})
			cfg := rest.CopyConfig(env.Config)
			cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
				return roundTripFunc(func(req *http.Request) (*http.Response, error) {
					if req.Method == http.MethodPatch {
						switch patches.Add(1) {
						case 1:
							close(inFlight)
							<-release
						case 2:
							close(second)
						}
					}
					return rt.RoundTrip(req)
				})
			})
			c, err := report.NewClient(cfg)
			if err != nil {
				t.Fatal(err)
			}
			r := report.New(c, node)
			sw := report.Switch{Phase: v1alpha1.NodePreparing, Active: v1alpha1.ModeIPTables, Target: v1alpha1.ModeNFTables}
			r.SetSwitch(sw)
			runCtx, stopRun := context.WithCancel(ctx)
			defer stopRun()
			go r.Run(runCtx)
			<-inFlight
			if tc.newer != "" {
				sw.Phase = tc.newer
				r.SetSwitch(sw)
			}
			flushed := make(chan error, 1)
			go func() { flushed <- r.Flush(ctx) }()
			// A Flush that does not wait for the write in flight sends its
			// own at once; one that waits sends nothing until released.
			// The wait only gives the first kind time to show itself.
			select {
			case <-second:
			case <-time.After(2 * time.Second):
			}
			close(release)
			if err := <-flushed; err != nil {
				t.Fatal(err)
			}
			stopRun()
			if got := patches.Load(); got != tc.wantPatches {
				t.Errorf("%d status writes, want %d", got, tc.wantPatches)
			}
			pn := &v1alpha1.ProxyNode{}
			if err := env.Client.Get(ctx, client.ObjectKey{Name: node}, pn); err != nil {
				t.Fatal(err)
			}
			if pn.Status.Phase != tc.wantPhase {
				t.Errorf("the API server shows phase %q, want %q", pn.Status.Phase, tc.wantPhase)
			}
		})
	}
}
