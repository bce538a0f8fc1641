package iptables

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/proxyshift/proxyshift/nodeagent/dataplane"
	dt "github.com/proxyshift/proxyshift/nodeagent/dataplane/dataplanetest"
	"github.com/proxyshift/proxyshift/nodeagent/model"
	"github.com/proxyshift/proxyshift/test/netlab"
)

// The kernel tests program real iptables rules, both variants, in network
// namespaces of their own (as root only; skipped when a variant's tools
// are missing).

// kernelNS returns a new network namespace, skipping the test unless v's
// tools are installed.
func kernelNS(t testing.TB, v Variant) *netlab.NetNS {
	t.Helper()
	netlab.RequireRoot(t)
	if ok, missing := (runner{variant: v}).installed(); !ok {
		t.Skipf("needs %s (Debian package iptables)", missing)
	}
	return netlab.NewNetNS(t, "ipt")
}

func newKernelBackend(t testing.TB, ns *netlab.NetNS, v Variant) *Backend {
	t.Helper()
	b, err := New(nodeWithIPs, WithVariant(v), WithNetNS(ns.NS()))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// ipt runs an iptables tool of variant v in ns: tool is "" (iptables
// itself), "save" or "restore"; ip6 selects ip6tables.
func ipt(t testing.TB, ns *netlab.NetNS, v Variant, ip6 bool, tool string, stdin string, args ...string) string {
	t.Helper()
	name := "iptables-" + string(v)
	if ip6 {
		name = "ip6tables-" + string(v)
	}
	if tool != "" {
		name += "-" + tool
	}
	path, err := lookPath(name)
	if err != nil {
		t.Fatal(err)
	}
	var in []byte
	if stdin != "" {
		in = []byte(stdin)
	}
	out, err := ns.NS().Output(context.Background(), in, path, args...)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// kernelModel is a mix of every kind of service, in both families.
func kernelModel() *model.Snapshot {
	v4 := dt.PortsOf(
		dt.Svc("default", "web", "http", "10.96.0.10", 80,
			dt.EP("10.244.1.2", 8080), dt.EP("10.244.2.3", 8080), dt.EP("10.244.3.4", 8080)),
		dt.Svc("default", "np", "http", "10.96.0.11", 80, dt.NodePort(30080), dt.EP("10.244.1.5", 8080, dt.Local)),
		dt.Svc("shop", "front", "https", "10.96.0.20", 443, dt.NodePort(30443), dt.LB("198.18.100.1"),
			dt.SourceRanges("203.0.113.0/24", "192.168.1.0/24"), dt.EP("10.244.1.6", 8443)),
		dt.Svc("default", "session", "http", "10.96.0.30", 80, dt.Affinity(time.Hour),
			dt.EP("10.244.1.7", 8080), dt.EP("10.244.2.7", 8080)),
		dt.Svc("default", "empty", "http", "10.96.0.40", 80, dt.NodePort(30040), dt.ExternalIPs("198.18.50.6")),
		dt.Svc("default", "ingress", "http", "10.96.0.80", 80, dt.NodePort(30081), dt.LB("198.18.100.2"), dt.ETPLocal,
			dt.EP("10.244.2.8", 8080)),
		dt.Svc("default", "dns", "dns", "10.96.0.53", 53, dt.UDP, dt.ExternalIPs("198.18.50.5"), dt.EP("10.244.1.9", 53)),
		dt.Svc("default", "cache", "dns", "10.96.0.54", 53, dt.UDP, dt.ITPLocal, dt.EP("10.244.2.9", 53)),
	)
	v6 := dt.PortsOf(
		dt.Svc("default", "web", "http", "fd00:10:96::10", 80, dt.NodePort(30080),
			dt.EP("fd00:10:244:1::2", 8080), dt.EP("fd00:10:244:2::3", 8080, dt.Local)),
	)
	return &model.Snapshot{Ports: map[corev1.IPFamily]map[model.ServicePortName]*model.ServicePort{
		corev1.IPv4Protocol: v4, corev1.IPv6Protocol: v6,
	}}
}

// ours renders proxyshift's part of both families' tables in ns, the
// way a reader compares them: every proxyshift chain with its rules
// sorted (the order of the ports' rules in the fixed chains depends on
// the sync history), and the jump rules of the built-in chains.
func ours(t testing.TB, ns *netlab.NetNS, v Variant) string {
	t.Helper()
	var b strings.Builder
	for _, ip6 := range []bool{false, true} {
		cur, err := parseSave([]byte(ipt(t, ns, v, ip6, "save", "")))
		if err != nil {
			t.Fatal(err)
		}
		for _, table := range tables {
			tb := cur[table]
			if tb == nil {
				continue
			}
			for _, c := range tb.chains {
				var rules []string
				for _, r := range tb.rules[c] {
					if owned(c) || owned(target(r)) {
						rules = append(rules, r)
					}
				}
				if !owned(c) && len(rules) == 0 {
					continue
				}
				if owned(c) {
					slices.Sort(rules)
				}
				fmt.Fprintf(&b, "ip6=%v %s %s\n", ip6, table, c)
				for _, r := range rules {
					b.WriteString("  " + r + "\n")
				}
			}
		}
	}
	return b.String()
}

// foreign renders everything in both families' tables in ns that is not
// proxyshift's, with the built-in chains' policies.
func foreign(t testing.TB, ns *netlab.NetNS, v Variant) string {
	t.Helper()
	var b strings.Builder
	for _, ip6 := range []bool{false, true} {
		for _, line := range strings.Split(ipt(t, ns, v, ip6, "save", ""), "\n") {
			if strings.HasPrefix(line, "#") || strings.Contains(line, ChainPrefix) {
				continue
			}
			if strings.HasPrefix(line, ":") {
				line = line[:strings.LastIndex(line, " ")] // counters
			}
			b.WriteString(line + "\n")
		}
	}
	return b.String()
}

// reference returns ours() of a fresh namespace after one full sync of m.
func reference(t testing.TB, v Variant, m *model.Snapshot) string {
	t.Helper()
	ns, _ := syncedBackend(t, v, m)
	return ours(t, ns, v)
}

// syncedBackend returns a network namespace of its own and a backend of
// variant v that has fully synced m there.
func syncedBackend(t testing.TB, v Variant, m *model.Snapshot) (*netlab.NetNS, *Backend) {
	t.Helper()
	ns := kernelNS(t, v)
	b := newKernelBackend(t, ns, v)
	if _, err := b.Sync(context.Background(), dataplane.SyncRequest{Model: m, Full: true}); err != nil {
		t.Fatal(err)
	}
	return ns, b
}

// forEachVariant runs fn as a subtest per variant.
func forEachVariant(t *testing.T, fn func(t *testing.T, v Variant)) {
	for _, v := range variants {
		t.Run(string(v), func(t *testing.T) { fn(t, v) })
	}
}

func TestKernelSyncReadsBack(t *testing.T) {
	forEachVariant(t, func(t *testing.T, v Variant) {
		ns := kernelNS(t, v)
		b := newKernelBackend(t, ns, v)
		ctx := context.Background()
		m := kernelModel()
		synced, err := b.Sync(ctx, dataplane.SyncRequest{Model: m, Full: true})
		if err != nil {
			t.Fatal(err)
		}
		got, err := b.Programmed(ctx)
		if err != nil || got != synced || got.Services != 9 || got.Endpoints != 11 {
			t.Errorf("programmed %+v, %v; sync said %+v; want 9 services and 11 endpoints", got, err, synced)
		}
		first := ours(t, ns, v)
		if _, err := b.Sync(ctx, dataplane.SyncRequest{Model: m, Full: true}); err != nil {
			t.Fatal(err)
		}
		if again := ours(t, ns, v); again != first {
			t.Errorf("a second full sync changed the tables:\n%s\nfirst:\n%s", again, first)
		}
	})
}

// Incremental syncs leave the kernel exactly as a full sync of the same
// model does.
func TestKernelIncrementalMatchesFull(t *testing.T) {
	forEachVariant(t, func(t *testing.T, v Variant) {
		m := kernelModel()
		ns, b := syncedBackend(t, v, m)
		ctx := context.Background()
		v4 := m.Ports[corev1.IPv4Protocol]
		web, np, empty := nameOf("default", "web", "http"), nameOf("default", "np", "http"), nameOf("default", "empty", "http")
		steps := []struct {
			name   string
			change func() model.ChangeSet
		}{
			{"endpoint replaced", func() model.ChangeSet {
				sp := *v4[web]
				sp.Endpoints = slices.Clone(sp.Endpoints)
				sp.Endpoints[2].IP = sp.Endpoints[2].IP.Next()
				v4[web] = &sp
				return model.ChangeSet{web: {}}
			}},
			{"endpoints lost", func() model.ChangeSet {
				sp := *v4[np]
				sp.Endpoints = nil
				v4[np] = &sp
				return model.ChangeSet{np: {}}
			}},
			{"endpoints gained, policy Local", func() model.ChangeSet {
				sp := *v4[empty]
				dt.EP("10.244.1.40", 80, dt.Local)(&sp)
				dt.ETPLocal(&sp)
				v4[empty] = &sp
				return model.ChangeSet{empty: {}}
			}},
			{"port deleted, port added, unchanged port named", func() model.ChangeSet {
				delete(v4, web)
				added := dt.Svc("default", "new", "http", "10.96.0.90", 80, dt.EP("10.244.3.90", 80))
				v4[added.Name] = added
				return model.ChangeSet{web: {}, added.Name: {}, np: {}}
			}},
		}
		for _, step := range steps {
			changed := step.change()
			if _, err := b.Sync(ctx, dataplane.SyncRequest{Model: m, Changed: changed}); err != nil {
				t.Fatalf("%s: %v", step.name, err)
			}
			if got, want := ours(t, ns, v), reference(t, v, m); got != want {
				t.Fatalf("%s: after the incremental sync:\n%s\nafter a full sync:\n%s", step.name, got, want)
			}
		}
		synced, _ := b.Sync(ctx, dataplane.SyncRequest{Model: m})
		if got, err := b.Programmed(ctx); err != nil || got != synced {
			t.Errorf("programmed %+v, %v; the backend counts %+v", got, err, synced)
		}
	})
}

// An incremental sync that finds the kernel not as it left it (a rule it
// deletes is gone) is redone as a full sync.
func TestKernelIncrementalFallsBackToFull(t *testing.T) {
	forEachVariant(t, func(t *testing.T, v Variant) {
		m := kernelModel()
		ns, b := syncedBackend(t, v, m)
		ctx := context.Background()
		// The rule an incremental sync of web would delete is gone.
		ipt(t, ns, v, false, "", "", "-t", "nat", "-F", chainServices)
		web := nameOf("default", "web", "http")
		v4 := m.Ports[corev1.IPv4Protocol]
		sp := *v4[web]
		sp.Endpoints = nil
		v4[web] = &sp
		if _, err := b.Sync(ctx, dataplane.SyncRequest{Model: m, Changed: model.ChangeSet{web: {}}}); err != nil {
			t.Fatal(err)
		}
		if got, want := ours(t, ns, v), reference(t, v, m); got != want {
			t.Errorf("after the sync:\n%s\nwant:\n%s", got, want)
		}
	})
}

func TestKernelRepairsDrift(t *testing.T) {
	forEachVariant(t, func(t *testing.T, v Variant) {
		m := kernelModel()
		ns, b := syncedBackend(t, v, m)
		ctx := context.Background()
		want := ours(t, ns, v)
		web := namesFor(nameOf("default", "web", "http"))
		ipt(t, ns, v, false, "", "", "-t", "nat", "-D", "PREROUTING", "1")
		ipt(t, ns, v, false, "", "", "-t", "nat", "-F", web.service)
		ipt(t, ns, v, false, "", "", "-t", "filter", "-I", "INPUT", "-j", chainFilter)
		ipt(t, ns, v, false, "", "", "-t", "nat", "-N", "PROXYSHIFT-SVC-LEFTOVER")
		ipt(t, ns, v, false, "", "", "-t", "nat", "-A", "PROXYSHIFT-SVC-LEFTOVER", "-j", chainMarkMasq)
		ipt(t, ns, v, false, "", "", "-t", "nat", "-A", "POSTROUTING", "-j", "PROXYSHIFT-SVC-LEFTOVER")
		ipt(t, ns, v, true, "", "", "-t", "nat", "-F", chainServices)
		if ours(t, ns, v) == want {
			t.Fatal("the drift changed nothing")
		}
		if _, err := b.Sync(ctx, dataplane.SyncRequest{Model: m, Full: true}); err != nil {
			t.Fatal(err)
		}
		if got := ours(t, ns, v); got != want {
			t.Errorf("after the repair:\n%s\nwant:\n%s", got, want)
		}
	})
}

// Syncs and cleanups change nothing that is not proxyshift's: not other
// chains and rules, not the built-in chains' policies.
func TestKernelLeavesOthersAlone(t *testing.T) {
	forEachVariant(t, func(t *testing.T, v Variant) {
		ns := kernelNS(t, v)
		for _, ip6 := range []bool{false, true} {
			ipt(t, ns, v, ip6, "restore", `*nat
:KUBE-SERVICES - [0:0]
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A KUBE-SERVICES -p tcp -m tcp --dport 80 -j RETURN
COMMIT
*filter
:FORWARD DROP [0:0]
:DOCKER - [0:0]
-A FORWARD -j DOCKER
-A INPUT -p tcp -m tcp --dport 22 -j ACCEPT
COMMIT
*mangle
:KUBE-IPTABLES-HINT - [0:0]
COMMIT
`, "--noflush")
		}
		before := foreign(t, ns, v)
		b := newKernelBackend(t, ns, v)
		ctx := context.Background()
		m := kernelModel()
		if _, err := b.Sync(ctx, dataplane.SyncRequest{Model: m, Full: true}); err != nil {
			t.Fatal(err)
		}
		web := nameOf("default", "web", "http")
		delete(m.Ports[corev1.IPv4Protocol], web)
		if _, err := b.Sync(ctx, dataplane.SyncRequest{Model: m, Changed: model.ChangeSet{web: {}}}); err != nil {
			t.Fatal(err)
		}
		if _, err := b.Sync(ctx, dataplane.SyncRequest{Model: m, Full: true}); err != nil {
			t.Fatal(err)
		}
		if after := foreign(t, ns, v); after != before {
			t.Errorf("syncs changed what is not proxyshift's:\n%s\nbefore:\n%s", after, before)
		}
		removed, err := b.Cleanup(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(removed) == 0 {
			t.Error("cleanup removed nothing")
		}
		if after := foreign(t, ns, v); after != before {
			t.Errorf("cleanup changed what is not proxyshift's:\n%s\nbefore:\n%s", after, before)
		}
		if left := ours(t, ns, v); left != "" {
			t.Errorf("left after cleanup:\n%s", left)
		}
		if got, err := b.Programmed(ctx); err != nil || got != (dataplane.Counts{}) {
			t.Errorf("programmed after cleanup: %+v, %v", got, err)
		}
	})
}

// Rules are never split between the variants: a backend's first sync
// removes proxyshift's objects from the other variant, and Cleanup
// removes them from both.
func TestKernelOneVariantOnly(t *testing.T) {
	ns := kernelNS(t, Legacy)
	if ok, missing := (runner{variant: NFT}).installed(); !ok {
		t.Skipf("needs %s", missing)
	}
	ctx := context.Background()
	m := kernelModel()
	legacy := newKernelBackend(t, ns, Legacy)
	if _, err := legacy.Sync(ctx, dataplane.SyncRequest{Model: m, Full: true}); err != nil {
		t.Fatal(err)
	}
	nft := newKernelBackend(t, ns, NFT)
	if _, err := nft.Sync(ctx, dataplane.SyncRequest{Model: m, Full: true}); err != nil {
		t.Fatal(err)
	}
	if left := ours(t, ns, Legacy); left != "" {
		t.Errorf("legacy still holds, after the nft backend's first sync:\n%s", left)
	}
	if ours(t, ns, NFT) == "" {
		t.Fatal("nft holds nothing")
	}

	// Something of ours in legacy behind the backend's back.
	ipt(t, ns, Legacy, false, "", "", "-t", "nat", "-N", "PROXYSHIFT-SVC-STRAY")
	removed, err := nft.Cleanup(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(removed, "iptables-legacy nat chain PROXYSHIFT-SVC-STRAY") ||
		!slices.Contains(removed, "iptables-nft nat rule PREROUTING -> PROXYSHIFT-SERVICES") ||
		!slices.Contains(removed, "ip6tables-nft filter chain PROXYSHIFT-FILTER") {
		t.Errorf("cleanup removed %q", removed)
	}
	for _, v := range variants {
		if left := ours(t, ns, v); left != "" {
			t.Errorf("%s holds after cleanup:\n%s", v, left)
		}
	}
}

// TestKernelRandomModels programs random models (dataplanetest.RandomModel,
// fixed seeds) into fresh namespaces with each variant: iptables-restore
// must take every ruleset, Programmed must read back what the sync
// counted, and a second full sync must find nothing to change.
func TestKernelRandomModels(t *testing.T) {
	forEachVariant(t, func(t *testing.T, v Variant) {
		for seed := range uint64(10) {
			ns := kernelNS(t, v)
			b := newKernelBackend(t, ns, v)
			ctx := context.Background()
			m := dt.RandomModel(rand.New(rand.NewPCG(seed, 1)), 8)
			synced, err := b.Sync(ctx, dataplane.SyncRequest{Model: m, Full: true})
			if err != nil {
				t.Fatalf("seed %d: %v", seed, err)
			}
			if got, err := b.Programmed(ctx); err != nil || got != synced {
				t.Errorf("seed %d: programmed %+v, %v; the sync said %+v", seed, got, err, synced)
			}
			first := ours(t, ns, v)
			if _, err := b.Sync(ctx, dataplane.SyncRequest{Model: m, Full: true}); err != nil {
				t.Fatalf("seed %d: second sync: %v", seed, err)
			}
			if again := ours(t, ns, v); again != first {
				t.Errorf("seed %d: a second full sync changed the tables:\n%s", seed, dt.LineDiff(first, again))
			}
		}
	})
}

// TestKernelPresent: Present finds proxyshift's rules after a sync, still
// finds them when only a fixed chain of one table of one family is left
// (a cleanup stopped half way), and not after a cleanup or on a fresh
// node.
func TestKernelPresent(t *testing.T) {
	forEachVariant(t, func(t *testing.T, v Variant) {
		ns := kernelNS(t, v)
		b := newKernelBackend(t, ns, v)
		ctx := context.Background()
		present := func(want bool, when string) {
			t.Helper()
			if got, err := b.Present(ctx); err != nil || got != want {
				t.Errorf("%s: Present = %v, %v; want %v", when, got, err, want)
			}
		}
		present(false, "fresh node")
		if _, err := b.Sync(ctx, dataplane.SyncRequest{Model: kernelModel(), Full: true}); err != nil {
			t.Fatal(err)
		}
		present(true, "after a sync")
		if _, err := b.Cleanup(ctx); err != nil {
			t.Fatal(err)
		}
		present(false, "after a cleanup")
		ipt(t, ns, v, true, "", "", "-t", "filter", "-N", chainFilter)
		present(true, "with ip6tables' "+chainFilter+" left")
		ipt(t, ns, v, true, "", "", "-t", "filter", "-X", chainFilter)
		ipt(t, ns, v, false, "", "", "-t", "nat", "-N", "PROXYSHIFT-OTHER")
		present(false, "with a chain of another name")
	})
}

// A cleanup by the backend that synced the rules removes its chains by
// name (iptables-nft), then lists the tables for anything else of
// proxyshift's: it reports the same objects as a cleanup that only lists
// them (a backend that never synced), removes chains the backend did not
// program, and still removes everything when one of its chains is gone
// already (the removal by name fails whole, the listing finds the rest).
func TestKernelCleanupOfWhatTheBackendProgrammed(t *testing.T) {
	forEachVariant(t, func(t *testing.T, v Variant) {
		ctx := context.Background()
		cleanedUp := func(t *testing.T, ns *netlab.NetNS, b *Backend) []string {
			t.Helper()
			removed, err := b.Cleanup(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if left := ours(t, ns, v); left != "" {
				t.Errorf("left after cleanup:\n%s", left)
			}
			slices.Sort(removed)
			return removed
		}

		if v == NFT {
			// The removal by name alone removes everything the sync
			// programmed: the listing after it has nothing left to find.
			ns, b := syncedBackend(t, v, kernelModel())
			cur, err := programmedTables(ns.NS(), ipv4, b.state[ipv4])
			if err != nil {
				t.Fatal(err)
			}
			if _, err := removeNFT(ns.NS(), ipv4, cur, runner{variant: v}.tool(ipv4)); err != nil {
				t.Fatalf("removal by name: %v", err)
			}
			left, err := nftTables(ctx, ns.NS(), ipv4, false)
			if err != nil {
				t.Fatal(err)
			}
			for table, tb := range left {
				for _, c := range tb.chains {
					if owned(c) {
						t.Errorf("left after the removal by name: %s chain %s", table, c)
					}
				}
			}
		}

		nsA, a := syncedBackend(t, v, kernelModel())
		byName := cleanedUp(t, nsA, a)
		nsB, _ := syncedBackend(t, v, kernelModel())
		listed := cleanedUp(t, nsB, newKernelBackend(t, nsB, v))
		if !slices.Equal(byName, listed) {
			t.Errorf("the syncing backend's cleanup removed\n%s\nthe listing cleanup\n%s", strings.Join(byName, "\n"), strings.Join(listed, "\n"))
		}

		t.Run("a chain it did not program", func(t *testing.T) {
			ns, b := syncedBackend(t, v, kernelModel())
			ipt(t, ns, v, false, "", "", "-t", "nat", "-N", ChainPrefix+"LEFTOVER")
			removed := cleanedUp(t, ns, b)
			if !slices.Contains(removed, removedChain(runner{variant: v}.tool(ipv4), tableNAT, ChainPrefix+"LEFTOVER")) {
				t.Errorf("the leftover chain is not among the removed objects:\n%s", strings.Join(removed, "\n"))
			}
			if len(removed) != len(listed)+1 {
				t.Errorf("removed %d objects, want %d", len(removed), len(listed)+1)
			}
		})
		t.Run("a chain of it gone", func(t *testing.T) {
			ns, b := syncedBackend(t, v, kernelModel())
			// Take one chain out (the first the listing names that
			// another chain jumps to): flush it and the chains that refer
			// to it, then delete it.
			cur, err := parseSave([]byte(ipt(t, ns, v, false, "save", "")))
			if err != nil {
				t.Fatal(err)
			}
			nat := cur[tableNAT]
			var gone string
			var from []string
			for _, c := range nat.chains {
				for _, r := range nat.rules[c] {
					if tgt := target(r); owned(c) && owned(tgt) && tgt != c && !nat.builtin[tgt] {
						if gone == "" {
							gone = tgt
						}
						if tgt == gone && !slices.Contains(from, c) {
							from = append(from, c)
						}
					}
				}
			}
			if gone == "" {
				t.Fatal("no proxyshift chain jumps to another")
			}
			for _, c := range append(from, gone) {
				ipt(t, ns, v, false, "", "", "-t", "nat", "-F", c)
			}
			ipt(t, ns, v, false, "", "", "-t", "nat", "-X", gone)
			removed := cleanedUp(t, ns, b)
			if want := removedChain(runner{variant: v}.tool(ipv4), tableNAT, gone); slices.Contains(removed, want) || len(removed) != len(listed)-1 {
				t.Errorf("removed %d objects (%q among them: %v), want %d without it", len(removed), want, slices.Contains(removed, want), len(listed)-1)
			}
		})
	})
}

// TestKernelUseCountsSeeWhatRuleCountsDoNot (nft variant): the
// verification and Programmed read only the chains, with the kernel's use
// counts (rules plus jumps to each chain). They find the kernel as synced;
// they see the dispatch rule of web's cluster IP turned into a jump to
// another port's service chain, which leaves every chain's number of
// rules as it was (counting rules, as the verification did before, sees
// nothing); and when the chains differ from the state, Programmed counts
// what the kernel holds rule by rule, endpoints by the DNAT rules.
func TestKernelUseCountsSeeWhatRuleCountsDoNot(t *testing.T) {
	ns := kernelNS(t, NFT)
	b := newKernelBackend(t, ns, NFT)
	ctx := context.Background()
	synced, err := b.Sync(ctx, dataplane.SyncRequest{Model: kernelModel(), Full: true})
	if err != nil {
		t.Fatal(err)
	}
	if got, ok, err := b.programmedAsSynced(ctx); err != nil || !ok || got != synced {
		t.Fatalf("programmedAsSynced after a sync: %+v, %v, %v; want %+v, true", got, ok, err, synced)
	}
	if why, err := b.verify(ctx, ipv4, b.state[ipv4]); err != nil || why != "" {
		t.Fatalf("verify after a sync: %q, %v", why, err)
	}

	// The dispatch rule of web's cluster IP is made to jump to np's
	// service chain.
	web := namesFor(model.ServicePortName{Namespace: "default", Name: "web", Port: "http", Protocol: corev1.ProtocolTCP}).service
	other := namesFor(model.ServicePortName{Namespace: "default", Name: "np", Port: "http", Protocol: corev1.ProtocolTCP}).service
	svc := chainServices
	rules := strings.Split(strings.TrimSpace(ipt(t, ns, NFT, false, "", "", "-t", "nat", "-S", svc)), "\n")[1:] // after -N
	var jumpsAt []int
	for i, r := range rules {
		if target(r) == web {
			jumpsAt = append(jumpsAt, i)
		}
	}
	if len(jumpsAt) != 1 {
		t.Fatalf("%s has %d jumps to web's service chain, want 1:\n%s", svc, len(jumpsAt), strings.Join(rules, "\n"))
	}
	first := rules[jumpsAt[0]]
	redirect := strings.Replace(first, "-A "+svc+" ", fmt.Sprintf("-R %s %d ", svc, jumpsAt[0]+1), 1)
	redirect = strings.Replace(redirect, "-j "+target(first), "-j "+other, 1)
	before, err := nftTables(ctx, ns.NS(), ipv4, true)
	if err != nil {
		t.Fatal(err)
	}
	ipt(t, ns, NFT, false, "restore", "*nat\n"+redirect+"\nCOMMIT\n", "--noflush")
	after, err := nftTables(ctx, ns.NS(), ipv4, true)
	if err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(after[tableNAT].counts, before[tableNAT].counts) {
		t.Fatal("the redirected jump changed a chain's number of rules: the test does not show what it means to")
	}
	why, err := b.verify(ctx, ipv4, b.state[ipv4])
	if err != nil || !strings.Contains(why, "use count") {
		t.Errorf("verify after the jump was redirected: %q, %v; want a use count that differs", why, err)
	}
	if _, ok, err := b.programmedAsSynced(ctx); err != nil || ok {
		t.Errorf("programmedAsSynced after the jump was redirected: ok %v, %v; want not ok", ok, err)
	}

	// web's service chain loses the DNAT rule of an endpoint:
	// Programmed counts the rules, and the endpoints by their DNAT rules.
	ipt(t, ns, NFT, false, "", "", "-t", "nat", "-D", web, "2")
	got, err := b.Programmed(ctx)
	if want := synced.Minus(dataplane.Counts{Rules: 1, Endpoints: 1}); err != nil || got != want {
		t.Errorf("Programmed after a DNAT rule was deleted: %+v, %v; want %+v", got, err, want)
	}
}

// TestKernelFillInParts: a full sync into empty tables (a switch into
// iptables) at fillMin ports or more fills them with restores at once
// (fill). The kernel then holds what one restore writes, Programmed
// reads back what the sync counted, and the next full sync, a rewrite in
// one restore, finds nothing to change. The nft variant only: the
// legacy one always writes a table in one piece. kernelModel's IPv6
// family has one port, so one of its parts has nothing to write.
func TestKernelFillInParts(t *testing.T) {
	ctx := context.Background()
	models := []*model.Snapshot{kernelModel()}
	for seed := range uint64(4) {
		models = append(models, dt.RandomModel(rand.New(rand.NewPCG(seed, 7)), 40))
	}
	for i, m := range models {
		ns := kernelNS(t, NFT)
		b := newKernelBackend(t, ns, NFT)
		b.fillMin = 1
		if !b.fillsInParts(nil, render(b.policy[families[0]], m.Ports[families[0].model])) {
			t.Skipf("fills in parts only with %d CPUs or more; GOMAXPROCS is %d", fillParts, runtime.GOMAXPROCS(0))
		}
		synced, err := b.Sync(ctx, dataplane.SyncRequest{Model: m, Full: true})
		if err != nil {
			t.Fatalf("model %d: %v", i, err)
		}
		if got, want := ours(t, ns, NFT), reference(t, NFT, m); got != want {
			t.Fatalf("model %d: filled in parts (- one restore, + the parts):\n%s", i, dt.LineDiff(want, got))
		}
		if got, err := b.Programmed(ctx); err != nil || got != synced {
			t.Errorf("model %d: programmed %+v, %v; the sync said %+v", i, got, err, synced)
		}
		for _, f := range families {
			if rs := b.state[f]; rs != nil {
				if why, err := b.verify(ctx, f, rs); err != nil || why != "" {
					t.Errorf("model %d, %s: the read-back after the fill: %q, %v", i, f.tool, why, err)
				}
			}
		}
		first := ours(t, ns, NFT)
		if _, err := b.Sync(ctx, dataplane.SyncRequest{Model: m, Full: true}); err != nil {
			t.Fatalf("model %d: second sync: %v", i, err)
		}
		if again := ours(t, ns, NFT); again != first {
			t.Errorf("model %d: the rewrite changed the tables:\n%s", i, dt.LineDiff(first, again))
		}
	}
}
