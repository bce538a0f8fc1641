package iptables

import (
	"context"
	"slices"
	"testing"

	"github.com/proxyshift/proxyshift/nodeagent/dataplane"
	dt "github.com/proxyshift/proxyshift/nodeagent/dataplane/dataplanetest"
)

func TestKernelDetect(t *testing.T) {
	ns := kernelNS(t, Legacy)
	if ok, missing := (runner{variant: NFT}).installed(); !ok {
		t.Skipf("needs %s", missing)
	}
	ctx := context.Background()
	if v, err := Detect(ctx, WithNetNS(ns.NS())); err != nil || v != NFT {
		t.Errorf("empty namespace: Detect = %q, %v; want nft", v, err)
	}
	want := []VariantFacts{{Variant: Legacy, Installed: true}, {Variant: NFT, Installed: true}}
	if got := KernelFacts(ctx, WithNetNS(ns.NS())); !slices.Equal(got, want) {
		t.Errorf("empty namespace: KernelFacts = %+v, want %+v", got, want)
	}

	ipt(t, ns, Legacy, false, "", "", "-t", "mangle", "-N", "KUBE-IPTABLES-HINT")
	if v, err := Detect(ctx, WithNetNS(ns.NS())); err != nil || v != Legacy {
		t.Errorf("kubelet's hint in legacy: Detect = %q, %v; want legacy", v, err)
	}
	want[0].HoldsRules = true
	if got := KernelFacts(ctx, WithNetNS(ns.NS())); !slices.Equal(got, want) {
		t.Errorf("kubelet's hint in legacy: KernelFacts = %+v, want %+v", got, want)
	}
	// New detects, and programs the detected variant only.
	b, err := New(node, WithNetNS(ns.NS()))
	if err != nil || b.Variant() != Legacy {
		t.Fatalf("New detected %v, %v; want legacy", b, err)
	}
}

// TestKernelDetectCountsRules: without a hint chain the variant with
// more foreign rules is the host's, proxyshift's own not counted; a hint
// chain, in any table, decides over any count. The nft variant's count takes
// iptables-nft-save, which detection runs only once legacy holds foreign
// rules; its hint chains are looked up over netlink.
func TestKernelDetectCountsRules(t *testing.T) {
	ns := kernelNS(t, Legacy)
	if ok, missing := (runner{variant: NFT}).installed(); !ok {
		t.Skipf("needs %s", missing)
	}
	ctx := context.Background()
	detect := func(when string, want Variant) {
		t.Helper()
		if v, err := Detect(ctx, WithNetNS(ns.NS())); err != nil || v != want {
			t.Errorf("%s: Detect = %q, %v; want %s", when, v, err, want)
		}
	}
	// proxyshift's own rules in nft, as on a node in iptables mode.
	b := newKernelBackend(t, ns, NFT)
	if _, err := b.Sync(ctx, dataplane.SyncRequest{Model: dt.BenchModel(20), Full: true}); err != nil {
		t.Fatal(err)
	}
	detect("proxyshift's rules in nft", NFT)
	for range 2 {
		ipt(t, ns, Legacy, false, "", "", "-t", "filter", "-A", "INPUT", "-j", "ACCEPT")
	}
	detect("two foreign rules in legacy, proxyshift's in nft", Legacy)
	for range 2 {
		ipt(t, ns, NFT, true, "", "", "-t", "filter", "-A", "INPUT", "-j", "ACCEPT")
	}
	detect("two foreign rules in each", NFT)
	ipt(t, ns, Legacy, false, "", "", "-t", "nat", "-A", "OUTPUT", "-j", "ACCEPT")
	detect("three foreign rules in legacy, two in nft", Legacy)
	ipt(t, ns, NFT, true, "", "", "-t", "nat", "-N", "KUBE-KUBELET-CANARY")
	detect("kubelet's canary in nft (IPv6 nat), more rules in legacy", NFT)
}

// The nft variant's facts come from use counts over netlink, not from
// iptables-nft-save: they must say what the save says, step by step, as
// the tables gain and lose rules and chains in either family.
func TestKernelFactsOfTheNFTVariant(t *testing.T) {
	ns := kernelNS(t, NFT)
	ctx := context.Background()
	for _, step := range []struct {
		name  string
		ip6   bool
		args  []string // none: only read
		holds bool
	}{
		{name: "empty namespace"},
		{name: "a listing, which creates nothing", args: []string{"-t", "filter", "-S", "INPUT"}},
		{name: "a rule in a built-in chain", args: []string{"-t", "filter", "-A", "INPUT", "-j", "ACCEPT"}, holds: true},
		{name: "the rule deleted: the table and its chain stay, empty", args: []string{"-t", "filter", "-D", "INPUT", "-j", "ACCEPT"}},
		{name: "kubelet's hint chain", args: []string{"-t", "mangle", "-N", "KUBE-IPTABLES-HINT"}, holds: true},
		{name: "the hint chain deleted", args: []string{"-t", "mangle", "-X", "KUBE-IPTABLES-HINT"}},
		{name: "an IPv6 rule", ip6: true, args: []string{"-t", "raw", "-A", "PREROUTING", "-j", "ACCEPT"}, holds: true},
		{name: "the IPv6 rule deleted", ip6: true, args: []string{"-t", "raw", "-D", "PREROUTING", "-j", "ACCEPT"}},
		{name: "an IPv6 chain of its own", ip6: true, args: []string{"-t", "nat", "-N", "SOMEONE-ELSES"}, holds: true},
	} {
		if len(step.args) > 0 {
			ipt(t, ns, NFT, step.ip6, "", "", step.args...)
		}
		got := facts(probeNFT(ctx, ns.NS()))
		want := VariantFacts{Variant: NFT, Installed: true, HoldsRules: step.holds}
		if got != want {
			t.Errorf("%s: facts(probeNFT) = %+v, want %+v", step.name, got, want)
		}
		if saved := facts(probeVariant(ctx, NFT, ns.NS())); saved != want {
			t.Errorf("%s: iptables-nft-save says %+v; the step expects %+v", step.name, saved, want)
		}
	}
}
