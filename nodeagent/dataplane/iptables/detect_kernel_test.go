package iptables

import (
	"context"
	"slices"
	"testing"
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
