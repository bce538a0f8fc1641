package agent_test

import (
	"context"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
	"github.com/proxyshift/proxyshift/nodeagent/dataplane"
	"github.com/proxyshift/proxyshift/nodeagent/report"
	"github.com/proxyshift/proxyshift/test/testenv"
)

// TestRecreatedProxyNodeGetsTheWholeStatus deletes a ProxyNode the agent
// has written its status to and creates it again under the same name, as
// the operator's ProxyNode controller does (a new UID, no status). The
// recreated ProxyNode must get the whole status: phase, active mode,
// kube-proxy's mode, rule counts and kernel facts, without which the
// operator's preflight fails the node ("agent has not reported kernel
// facts") and a rollout never sees it converge. The reporter sent only
// what changed since its last write to the old ProxyNode, and nothing at
// all when nothing changed.
func TestRecreatedProxyNodeGetsTheWholeStatus(t *testing.T) {
	env := testenv.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	active := report.Switch{Phase: v1alpha1.NodeActive, Active: v1alpha1.ModeNFTables, Target: v1alpha1.ModeNFTables, KubeProxyMode: v1alpha1.ModeIPTables}
	synced := func() report.Sync {
		return report.Sync{Time: time.Now(), Duration: time.Millisecond, Counts: dataplane.Counts{Services: 3, Endpoints: 5, Rules: 40}}
	}
	for _, tc := range []struct {
		name string
		// informer: the reporter follows its ProxyNode through an informer,
		// as the agent wires it.
		informer bool
		// whileGone and afterCreate run between the delete and the create,
		// and after the create.
		whileGone, afterCreate func(t *testing.T, r *report.Reporter)
	}{
		{
			// The agent's way: the status does not change, so only the
			// informer can tell the reporter that the ProxyNode is new.
			name:     "the informer sees it recreated while nothing changes",
			informer: true,
		},
		{
			name: "a write finds it gone",
			whileGone: func(t *testing.T, r *report.Reporter) {
				r.SetSync(synced())
				if err := r.Flush(ctx); !apierrors.IsNotFound(err) {
					t.Fatalf("a status write while the ProxyNode is gone returned %v, want NotFound", err)
				}
			},
		},
		{
			// A new spec acted on: the change lands on the new ProxyNode.
			name: "a write of a change lands on the recreated one",
			afterCreate: func(t *testing.T, r *report.Reporter) {
				sw := active
				sw.Config, sw.Generation = &v1alpha1.ConfigReference{Name: "cluster", Generation: 1}, 2
				r.SetSwitch(sw)
				r.SetSync(synced())
				if err := r.Flush(ctx); err != nil {
					t.Fatal(err)
				}
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			node := map[bool]string{true: "recreated-informer", false: "recreated"}[tc.informer]
			if tc.whileGone != nil {
				node += "-gone"
			}
			if tc.afterCreate != nil {
				node += "-changed"
			}
			create := func() types.UID {
				pn := &v1alpha1.ProxyNode{ObjectMeta: metav1.ObjectMeta{Name: node}}
				if err := env.Client.Create(ctx, pn); err != nil {
					t.Fatal(err)
				}
				return pn.UID
			}
			first := create()
			c, err := report.NewClient(env.Config)
			if err != nil {
				t.Fatal(err)
			}
			r := report.New(c, node)
			r.SyncEvery = time.Second
			if tc.informer {
				inf := cache.NewSharedIndexInformer(c.ListWatch(node), &v1alpha1.ProxyNode{}, 0, cache.Indexers{})
				if _, err := inf.AddEventHandler(r.Follow()); err != nil {
					t.Fatal(err)
				}
				go inf.Run(ctx.Done())
				if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
					t.Fatal("the ProxyNode informer did not sync")
				}
			}
			runCtx, stopRun := context.WithCancel(ctx)
			defer stopRun()
			go r.Run(runCtx)
			r.SetKernel(v1alpha1.KernelFacts{Version: "6.1", NFTables: v1alpha1.CapabilityYes})
			r.SetSwitch(active)
			r.SetSync(synced())
			if err := r.Flush(ctx); err != nil {
				t.Fatal(err)
			}
			status := func() v1alpha1.ProxyNodeStatus {
				pn := &v1alpha1.ProxyNode{}
				if err := env.Client.Get(ctx, client.ObjectKey{Name: node}, pn); err != nil {
					t.Fatal(err)
				}
				return pn.Status
			}
			if st := status(); !whole(st) {
				t.Fatalf("the first ProxyNode's status is not whole: %+v", st)
			}

			if err := env.Client.Delete(ctx, &v1alpha1.ProxyNode{ObjectMeta: metav1.ObjectMeta{Name: node}}); err != nil {
				t.Fatal(err)
			}
			if tc.whileGone != nil {
				tc.whileGone(t, r)
			}
			if second := create(); second == first {
				t.Fatalf("the recreated ProxyNode has the old UID %s", first)
			}
			if tc.afterCreate != nil {
				tc.afterCreate(t, r)
			}

			// Run writes at least every 5 seconds while it knows nothing
			// written; 15 seconds leave room for its backoff.
			deadline := time.Now().Add(15 * time.Second)
			st := status()
			for !whole(st) && time.Now().Before(deadline) {
				time.Sleep(200 * time.Millisecond)
				st = status()
			}
			if !whole(st) {
				t.Errorf("the recreated ProxyNode does not get the whole status: phase %q, active mode %q, kube-proxy mode %q, counts %v, kernel facts %v",
					st.Phase, st.ActiveMode, st.KubeProxyMode, st.Counts, st.Kernel)
			}
		})
	}
}

// whole says whether st has every field the reporter was told of in
// TestRecreatedProxyNodeGetsTheWholeStatus.
func whole(st v1alpha1.ProxyNodeStatus) bool {
	return st.Phase == v1alpha1.NodeActive && st.ActiveMode == v1alpha1.ModeNFTables && st.KubeProxyMode == v1alpha1.ModeIPTables &&
		st.Counts != nil && st.Counts.Rules == 40 && st.Kernel != nil && st.Kernel.Version == "6.1"
}

// TestAgentReportsToARecreatedProxyNode runs the agent on a lab node
// until its ProxyNode shows nftables Active with counts and kernel facts,
// then deletes the ProxyNode and creates it again with the same spec. The
// recreated ProxyNode must get the same status from the agent, which
// keeps serving. (The agent notices the recreation both through its
// ProxyNode informer and because its conditions' observedGeneration
// passes through 0 while the ProxyNode is gone, so this test does not
// tell the two apart; TestRecreatedProxyNodeGetsTheWholeStatus does.)
func TestAgentReportsToARecreatedProxyNode(t *testing.T) {
	w := newStartWorld(t, v1alpha1.ProxySettings{})
	ctx := context.Background()
	w.run(t, w.env.Config)
	reported := func(what string) {
		t.Helper()
		deadline := time.Now().Add(60 * time.Second)
		for {
			pn := &v1alpha1.ProxyNode{}
			if err := w.env.Client.Get(ctx, client.ObjectKey{Name: startNode}, pn); err != nil {
				t.Fatal(err)
			}
			st := pn.Status
			if st.Phase == v1alpha1.NodeActive && st.ActiveMode == v1alpha1.ModeNFTables && st.Kernel != nil && st.Counts != nil {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s ProxyNode's status: phase %q, active mode %q, counts %v, kernel facts %v; want nftables Active with counts and kernel facts",
					what, st.Phase, st.ActiveMode, st.Counts, st.Kernel)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	reported("the first")
	w.running(t)

	spec := v1alpha1.ProxyNodeSpec{DesiredMode: v1alpha1.ModeNFTables}
	if err := w.env.Client.Delete(ctx, &v1alpha1.ProxyNode{ObjectMeta: metav1.ObjectMeta{Name: startNode}}); err != nil {
		t.Fatal(err)
	}
	if err := w.env.Client.Create(ctx, &v1alpha1.ProxyNode{ObjectMeta: metav1.ObjectMeta{Name: startNode}, Spec: spec}); err != nil {
		t.Fatal(err)
	}
	reported("the recreated")
	w.running(t)
}
