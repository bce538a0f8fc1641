package preflight

import (
	"strings"
	"testing"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
)

func mods(kv ...string) []v1alpha1.KernelModule {
	var out []v1alpha1.KernelModule
	for i := 0; i < len(kv); i += 2 {
		out = append(out, v1alpha1.KernelModule{Name: kv[i], State: v1alpha1.ModuleState(kv[i+1])})
	}
	return out
}

func TestProblems(t *testing.T) {
	good := mods("ip_vs", "Loaded", "ip_vs_rr", "BuiltIn", "nf_conntrack", "Loadable", "ip_vs_sh", "Missing")
	wlc := &v1alpha1.ProxySettings{IPVS: &v1alpha1.IPVSSettings{Scheduler: "sh"}}
	for _, tc := range []struct {
		name     string
		mode     v1alpha1.ProxyMode
		settings *v1alpha1.ProxySettings
		k        *v1alpha1.KernelFacts
		want     []string // substrings, one per problem
	}{
		{"no facts", v1alpha1.ModeNFTables, nil, nil, []string{"not reported kernel facts"}},
		{"ipvs ok", v1alpha1.ModeIPVS, nil, &v1alpha1.KernelFacts{Modules: good}, nil},
		{"ipvs scheduler missing", v1alpha1.ModeIPVS, wlc, &v1alpha1.KernelFacts{Modules: good}, []string{"ip_vs_sh is Missing"}},
		{"ipvs all missing", v1alpha1.ModeIPVS, nil, &v1alpha1.KernelFacts{}, []string{"ip_vs not reported", "ip_vs_rr not reported", "nf_conntrack not reported"}},
		{"ipvs unknown fails closed", v1alpha1.ModeIPVS, nil, &v1alpha1.KernelFacts{Modules: mods("ip_vs", "Unknown", "ip_vs_rr", "Loaded", "nf_conntrack", "Loaded")}, []string{"ip_vs is Unknown"}},
		{"nftables yes", v1alpha1.ModeNFTables, nil, &v1alpha1.KernelFacts{NFTables: "Yes"}, nil},
		{"nftables no", v1alpha1.ModeNFTables, nil, &v1alpha1.KernelFacts{NFTables: "No"}, []string{"nftables: No"}},
		{"nftables unreported", v1alpha1.ModeNFTables, nil, &v1alpha1.KernelFacts{}, []string{"nftables: Unknown"}},
		{"iptables nft", v1alpha1.ModeIPTables, nil, &v1alpha1.KernelFacts{IPTablesBackends: []v1alpha1.IPTablesBackend{{Name: "legacy", Available: "No"}, {Name: "nft", Available: "Yes"}}}, nil},
		{"iptables none usable", v1alpha1.ModeIPTables, nil, &v1alpha1.KernelFacts{IPTablesBackends: []v1alpha1.IPTablesBackend{{Name: "legacy", Available: "No"}, {Name: "nft", Available: "Unknown"}}}, []string{"legacy: No, nft: Unknown"}},
		{"iptables none reported", v1alpha1.ModeIPTables, nil, &v1alpha1.KernelFacts{}, []string{"no iptables backend reported"}},
		{"kube-proxy needs no module", v1alpha1.ModeKubeProxy, nil, &v1alpha1.KernelFacts{}, nil},
		{"unknown mode", "ebpf", nil, &v1alpha1.KernelFacts{}, []string{"unknown proxy mode"}},
	} {
		got := Problems(tc.mode, tc.settings, tc.k)
		if len(got) != len(tc.want) {
			t.Errorf("%s: got %q, want %d problems", tc.name, got, len(tc.want))
			continue
		}
		for i := range got {
			if !strings.Contains(got[i], tc.want[i]) {
				t.Errorf("%s: problem %q does not mention %q", tc.name, got[i], tc.want[i])
			}
		}
	}
}

// TestKubeProxyOverlap: only proxyshift's ipvs mode beside kube-proxy's
// IPVS mode is refused; every other pair, and a node without kube-proxy's
// rules, is not.
func TestKubeProxyOverlap(t *testing.T) {
	modes := []v1alpha1.ProxyMode{v1alpha1.ModeIPTables, v1alpha1.ModeNFTables, v1alpha1.ModeIPVS, v1alpha1.ModeKubeProxy}
	for _, mode := range modes {
		for _, kp := range []v1alpha1.ProxyMode{"", v1alpha1.ModeIPTables, v1alpha1.ModeNFTables, v1alpha1.ModeIPVS} {
			why := KubeProxyOverlap(mode, kp)
			if want := mode == v1alpha1.ModeIPVS && kp == v1alpha1.ModeIPVS; (why != "") != want {
				t.Errorf("KubeProxyOverlap(%s, kube-proxy %q) = %q, want refused %v", mode, kp, why, want)
			}
		}
	}
}
