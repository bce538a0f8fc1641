package iptables

import (
	"context"
	"errors"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/proxyshift/proxyshift/nodeagent/dataplane"
	dt "github.com/proxyshift/proxyshift/nodeagent/dataplane/dataplanetest"
	"github.com/proxyshift/proxyshift/nodeagent/dataplane/internal/nft"
	"github.com/proxyshift/proxyshift/nodeagent/model"
)

// TestKernelResyncVerifiesAndRepairs, in both variants: after a full sync
// and incremental ones, the periodic resync's verification finds the
// tables as the backend left them (so the resync writes nothing); each
// kind of damage by hand is found, and the resync then rewrites the
// tables as a full sync of the model does.
func TestKernelResyncVerifiesAndRepairs(t *testing.T) {
	forEachVariant(t, func(t *testing.T, v Variant) {
		m := kernelModel()
		ns, b := syncedBackend(t, v, m)
		ctx := context.Background()
		v4 := m.Ports[corev1.IPv4Protocol]
		web := model.ServicePortName{Namespace: "default", Name: "web", Port: "http", Protocol: corev1.ProtocolTCP}
		empty := model.ServicePortName{Namespace: "default", Name: "empty", Port: "http", Protocol: corev1.ProtocolTCP}
		v4[web] = dt.Svc("default", "web", "http", "10.96.0.10", 80, dt.EP("10.244.1.2", 8080), dt.EP("10.244.3.99", 8080))
		delete(v4, empty)
		added := dt.Svc("default", "new", "grpc", "10.96.0.90", 9090, dt.NodePort(30090), dt.EP("10.244.4.5", 9090))
		v4[added.Name] = added
		if _, err := b.Sync(ctx, dataplane.SyncRequest{Model: m, Changed: model.ChangeSet{web: {}, empty: {}, added.Name: {}}}); err != nil {
			t.Fatal(err)
		}
		for _, f := range families {
			if why, err := b.verify(ctx, f, b.state[f]); err != nil || why != "" {
				t.Fatalf("%s: verify after the syncs: %q, %v; want no difference", f.tool, why, err)
			}
		}
		want := reference(t, v, m)

		webChain := ""
		for _, l := range strings.Split(ipt(t, ns, v, false, "save", "", "-t", "nat"), "\n") {
			if strings.Contains(l, `"default/web:http/TCP cluster IP"`) {
				f := strings.Fields(l)
				webChain = f[len(f)-1]
			}
		}
		if webChain == "" {
			t.Fatal("no rule of web's cluster IP in nat")
		}
		for _, c := range []struct {
			name   string
			damage func()
		}{
			{"jump deleted", func() { ipt(t, ns, v, false, "", "", "-t", "nat", "-D", "PREROUTING", "1") }},
			{"service chain flushed", func() { ipt(t, ns, v, false, "", "", "-t", "nat", "-F", webChain) }},
			{"rule added to a proxyshift chain", func() { ipt(t, ns, v, true, "", "", "-t", "filter", "-A", chainFilter, "-j", "RETURN") }},
			{"proxyshift-looking chain added", func() { ipt(t, ns, v, false, "", "", "-t", "nat", "-N", ChainPrefix+"INTRUDER") }},
			{"jump duplicated", func() {
				ipt(t, ns, v, false, "", "", "-t", "filter", "-A", "INPUT", "-j", chainFilter)
			}},
		} {
			t.Run(c.name, func(t *testing.T) {
				c.damage()
				found := ""
				for _, f := range families {
					why, err := b.verify(ctx, f, b.state[f])
					if err != nil {
						t.Fatal(err)
					}
					if why != "" {
						t.Logf("%s: %s", f.tool, why)
						found = why
					}
				}
				if found == "" {
					t.Fatal("the verification found no difference after the damage")
				}
				if _, err := b.Sync(ctx, dataplane.SyncRequest{Model: m, Full: true, Resync: true}); err != nil {
					t.Fatal(err)
				}
				if got := ours(t, ns, v); got != want {
					t.Errorf("after the resync:\n%s\nwant (a full sync of the model):\n%s", got, want)
				}
			})
		}

		// A resync whose context has ended (a change is waiting) stops
		// with that context's error and writes nothing.
		ipt(t, ns, v, false, "", "", "-t", "nat", "-F", webChain)
		damaged := ours(t, ns, v)
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		req := dataplane.SyncRequest{Model: m, Full: true, Resync: true}
		_, err := b.Sync(cctx, req)
		if !errors.Is(err, context.Canceled) || !dataplane.Preempted(cctx, req, err) {
			t.Fatalf("preempted resync returned %v; want the context's error", err)
		}
		if got := ours(t, ns, v); got != damaged {
			t.Errorf("a preempted resync wrote:\n%s\nwas:\n%s", got, damaged)
		}
	})
}

// TestKernelResyncTrustsAQuietGeneration (nft variant): a resync that
// verified every family records the ruleset generation, the backend's own
// restores move it on, and any other commit (damage by hand) moves it
// away, so that the next resync verifies again and repairs.
func TestKernelResyncTrustsAQuietGeneration(t *testing.T) {
	ns := kernelNS(t, NFT)
	b := newKernelBackend(t, ns, NFT)
	ctx := context.Background()
	m := kernelModel()
	resync := dataplane.SyncRequest{Model: m, Full: true, Resync: true}
	gen := func() uint32 {
		g, err := nft.Generation(ns.NS())
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	for _, req := range []dataplane.SyncRequest{{Model: m, Full: true}, resync} {
		if _, err := b.Sync(ctx, req); err != nil {
			t.Fatal(err)
		}
	}
	if !b.genKnown || b.gen != gen() {
		t.Fatalf("after a clean resync: known %v, gen %d; kernel %d", b.genKnown, b.gen, gen())
	}
	web := model.ServicePortName{Namespace: "default", Name: "web", Port: "http", Protocol: corev1.ProtocolTCP}
	m.Ports[corev1.IPv4Protocol][web] = dt.Svc("default", "web", "http", "10.96.0.10", 80, dt.EP("10.244.1.2", 8080))
	if _, err := b.Sync(ctx, dataplane.SyncRequest{Model: m, Changed: model.ChangeSet{web: {}}}); err != nil {
		t.Fatal(err)
	}
	if !b.genKnown || b.gen != gen() {
		t.Fatalf("after an incremental sync of ours: known %v, gen %d; kernel %d", b.genKnown, b.gen, gen())
	}
	want := reference(t, NFT, m)
	ipt(t, ns, NFT, false, "", "", "-t", "nat", "-D", "PREROUTING", "1")
	if _, err := b.Sync(ctx, resync); err != nil {
		t.Fatal(err)
	}
	if got := ours(t, ns, NFT); got != want {
		t.Errorf("after the resync:\n%s\nwant:\n%s", got, want)
	}
}
