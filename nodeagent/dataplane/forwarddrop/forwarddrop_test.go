package forwarddrop

import (
	"errors"
	"testing"

	"github.com/google/nftables"

	"github.com/proxyshift/proxyshift/nodeagent/dataplane"
)

func TestDropsForwarded(t *testing.T) {
	drop, accept := nftables.ChainPolicyDrop, nftables.ChainPolicyAccept
	chain := func(fam nftables.TableFamily, hook *nftables.ChainHook, policy *nftables.ChainPolicy) *nftables.Chain {
		return &nftables.Chain{Name: "c", Table: &nftables.Table{Name: "t", Family: fam}, Hooknum: hook, Policy: policy}
	}
	for _, tc := range []struct {
		name string
		c    *nftables.Chain
		want bool
	}{
		{"ip forward drop (iptables-nft's FORWARD DROP)", chain(nftables.TableFamilyIPv4, nftables.ChainHookForward, &drop), true},
		{"inet forward drop", chain(nftables.TableFamilyINet, nftables.ChainHookForward, &drop), true},
		{"ip6 forward drop", chain(nftables.TableFamilyIPv6, nftables.ChainHookForward, &drop), true},
		{"forward accept", chain(nftables.TableFamilyIPv4, nftables.ChainHookForward, &accept), false},
		{"input drop", chain(nftables.TableFamilyIPv4, nftables.ChainHookInput, &drop), false},
		{"bridge forward drop", chain(nftables.TableFamilyBridge, nftables.ChainHookForward, &drop), false},
		{"regular chain", chain(nftables.TableFamilyIPv4, nil, nil), false},
	} {
		if got := dropsForwarded(tc.c); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestPolicyDrop(t *testing.T) {
	if !policyDrop("-P FORWARD DROP\n-A FORWARD -j DOCKER-USER\n") {
		t.Error("policy DROP not found")
	}
	if policyDrop("-P FORWARD ACCEPT\n-A FORWARD -j DROP\n") {
		t.Error("a DROP rule taken for the policy")
	}
}

func TestWarningIsADataplaneWarning(t *testing.T) {
	err := errors.Join(&Warning{Mode: "nftables", Chains: []string{"nftables ip filter FORWARD"}})
	ws, rest := dataplane.SplitWarnings(err)
	if rest != nil || len(ws) != 1 || ws[0].LeftAlone()[0] != "nftables ip filter FORWARD" {
		t.Errorf("SplitWarnings: %v, %v", ws, rest)
	}
}
