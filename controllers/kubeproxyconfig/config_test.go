package kubeproxyconfig

import (
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
)

// kubeadmConfig is shaped like the file kubeadm v1.37 writes (shortened).
const kubeadmConfig = `apiVersion: kubeproxy.config.k8s.io/v1alpha1
bindAddress: 0.0.0.0
clientConnection:
  kubeconfig: /var/lib/kube-proxy/kubeconfig.conf
clusterCIDR: 198.18.64.0/18,2001:db8:1::/64
# a comment a person wrote
iptables:
  masqueradeAll: false
ipvs:
  scheduler: ""
kind: KubeProxyConfiguration
mode: ""
nodePortAddresses:
- primary
`

func configMap(text string) *corev1.ConfigMap {
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "kube-proxy"}, Data: map[string]string{"config.conf": text}}
}

func TestParse(t *testing.T) {
	c, err := Parse(kubeadmConfig)
	if err != nil {
		t.Fatal(err)
	}
	if c.Mode != v1alpha1.ModeIPTables {
		t.Errorf("mode %q, want iptables for the empty mode", c.Mode)
	}
	if len(c.ClusterCIDRs) != 2 || c.ClusterCIDRs[1] != "2001:db8:1::/64" {
		t.Errorf("cluster CIDRs %v", c.ClusterCIDRs)
	}
	if len(c.NodePortAddresses) != 1 || c.NodePortAddresses[0] != "primary" {
		t.Errorf("nodePortAddresses %v", c.NodePortAddresses)
	}
	for _, bad := range []string{"kind: KubeProxyConfiguration\nmode: kernelspace\n", "kind: ConfigMap\n", "{{"} {
		if _, err := Parse(bad); err == nil {
			t.Errorf("Parse(%q) succeeded", bad)
		}
	}
}

// TestNodePortAddressesAsKubeProxyAppliesThem: kube-proxy v1.37's
// nftables mode reads an unset nodePortAddresses as primary, its other
// modes as every local address (empty); an explicit list is kept in every
// mode. InMode reads the same file as another mode would.
func TestNodePortAddressesAsKubeProxyAppliesThem(t *testing.T) {
	file := func(mode, addrs string) string {
		return "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: " + mode + "\n" + addrs
	}
	const cidr = "nodePortAddresses: [198.18.0.0/15]\n"
	primary := []v1alpha1.NodePortAddress{v1alpha1.NodePortAddressPrimary}
	for _, tc := range []struct {
		name string
		text string
		in   v1alpha1.ProxyMode // "": the file's own mode
		want []v1alpha1.NodePortAddress
	}{
		{name: "nftables, unset", text: file("nftables", ""), want: primary},
		{name: "nftables, a CIDR", text: file("nftables", cidr), want: []v1alpha1.NodePortAddress{"198.18.0.0/15"}},
		{name: "iptables, unset", text: file(`""`, "")},
		{name: "ipvs, unset", text: file("ipvs", "")},
		{name: "nftables read as iptables", text: file("nftables", ""), in: v1alpha1.ModeIPTables},
		{name: "iptables read as nftables", text: file("iptables", ""), in: v1alpha1.ModeNFTables, want: primary},
		{name: "ipvs, primary, read as iptables", text: file("ipvs", "nodePortAddresses: [primary]\n"), in: v1alpha1.ModeIPTables, want: primary},
		{name: "nftables, all", text: file("nftables", "nodePortAddresses: [all]\n")},
		{name: "iptables, all beside a CIDR", text: file("iptables", "nodePortAddresses: [198.18.0.0/15, all]\n")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Parse(tc.text)
			if err != nil {
				t.Fatal(err)
			}
			if tc.in != "" {
				if c = c.InMode(tc.in); c.Mode != tc.in {
					t.Errorf("InMode(%s) says mode %s", tc.in, c.Mode)
				}
			}
			if !slices.Equal(c.NodePortAddresses, tc.want) {
				t.Errorf("nodePortAddresses %q, want %q", c.NodePortAddresses, tc.want)
			}
		})
	}
}

// TestCheckSettings: what kube-proxy accepts in nodePortAddresses and
// clusterCIDR and proxyshift's settings cannot say is named; the rest
// passes.
func TestCheckSettings(t *testing.T) {
	for addrs, want := range map[string]string{
		"":                               "",
		"[primary]":                      "",
		"[198.18.0.0/15, 2001:db8::/64]": "",
		"[all]":                          "",
		"[localhost, all]":               "",
		"[localhost]":                    "keyword localhost (NodePorts on 127.0.0.1 and ::1)",
		"[198.18.0.0/15, localhost]":     "keyword localhost",
		"[primary, 198.18.0.0/15]":       "keyword primary beside CIDRs",
		"[198.018.0.0/15]":               `"198.018.0.0/15" is not a CIDR`,
		"['::ffff:198.18.0.0/111']":      "IPv4-mapped IPv6 network",
	} {
		text := "kind: KubeProxyConfiguration\nmode: nftables\n"
		if addrs != "" {
			text += "nodePortAddresses: " + addrs + "\n"
		}
		c, err := Parse(text)
		if err != nil {
			t.Fatalf("%s: %v", addrs, err)
		}
		err = c.CheckSettings()
		switch {
		case want == "" && err != nil:
			t.Errorf("%s: %v; want no error", addrs, err)
		case want != "" && (err == nil || !strings.Contains(err.Error(), want)):
			t.Errorf("%s: %v; want an error saying %q", addrs, err, want)
		}
	}
}

func TestCheckSettingsClusterCIDR(t *testing.T) {
	for cidr, want := range map[string]string{
		"198.18.64.0/18":                  "",
		"198.18.64.0/18, 2001:db8:1::/64": "",
		"198.018.64.0/18":                 `in its clusterCIDR, "198.018.64.0/18" is not a CIDR`,
	} {
		c, err := Parse("kind: KubeProxyConfiguration\nclusterCIDR: " + cidr + "\n")
		if err != nil {
			t.Fatalf("%s: %v", cidr, err)
		}
		err = c.CheckSettings()
		if want == "" && err != nil || want != "" && (err == nil || !strings.Contains(err.Error(), want)) {
			t.Errorf("clusterCIDR %s: %v; want %q", cidr, err, want)
		}
	}
}

func TestSetMode(t *testing.T) {
	out, err := SetMode(kubeadmConfig, v1alpha1.ModeNFTables)
	if err != nil {
		t.Fatal(err)
	}
	if want := strings.Replace(kubeadmConfig, `mode: ""`, "mode: nftables", 1); out != want {
		t.Errorf("SetMode changed more than the mode line:\n%s", out)
	}
	noMode := strings.Replace(kubeadmConfig, "mode: \"\"\n", "", 1)
	out, err = SetMode(noMode, v1alpha1.ModeIPVS)
	if err != nil || !strings.HasSuffix(out, "mode: ipvs\n") {
		t.Errorf("SetMode without a mode line: %q, %v", out, err)
	}
	if _, err := SetMode(`{"kind":"KubeProxyConfiguration"}`, v1alpha1.ModeIPVS); err == nil {
		t.Error("SetMode edited a one-line JSON file")
	}
	// A nested mode key is not the top-level one.
	if out, err := SetMode(kubeadmConfig+"winkernel:\n  mode: x\n", v1alpha1.ModeNFTables); err != nil || !strings.Contains(out, "  mode: x") {
		t.Errorf("SetMode touched a nested mode: %q, %v", out, err)
	}
}

func TestWithModeRoundTrip(t *testing.T) {
	cm := configMap(kubeadmConfig)
	changed, err := WithMode(cm, "config.conf", v1alpha1.ModeNFTables)
	if err != nil || changed == nil {
		t.Fatalf("WithMode nftables: %v, %v", changed, err)
	}
	if c, _ := Read(changed, "config.conf"); c.Mode != v1alpha1.ModeNFTables {
		t.Errorf("mode after the change %s", c.Mode)
	}
	if changed.Annotations[AnnotationPrevious] != kubeadmConfig {
		t.Error("the previous file was not kept")
	}
	if m, ok := PreviousMode(changed); !ok || m != v1alpha1.ModeIPTables {
		t.Errorf("PreviousMode %s %v", m, ok)
	}
	if again, err := WithMode(changed, "config.conf", v1alpha1.ModeNFTables); err != nil || again != nil {
		t.Errorf("a second WithMode to the same mode writes: %v, %v", again, err)
	}
	// Via another mode, then back: the file is restored byte for byte.
	ipvs, err := WithMode(changed, "config.conf", v1alpha1.ModeIPVS)
	if err != nil || ipvs.Annotations[AnnotationPrevious] != kubeadmConfig {
		t.Fatalf("WithMode ipvs: %v (previous kept: %v)", err, ipvs != nil && ipvs.Annotations[AnnotationPrevious] == kubeadmConfig)
	}
	back, err := WithMode(ipvs, "config.conf", v1alpha1.ModeIPTables)
	if err != nil {
		t.Fatal(err)
	}
	if back.Data["config.conf"] != kubeadmConfig {
		t.Errorf("not restored byte for byte:\n%s", back.Data["config.conf"])
	}
	if _, ok := back.Annotations[AnnotationPrevious]; ok {
		t.Error("the previous-config annotation stayed after the restore")
	}
	if _, ok := back.Annotations[AnnotationWritten]; ok {
		t.Error("the digest annotation stayed after the restore")
	}
}

func TestWithModeKeepsAPersonsEdit(t *testing.T) {
	changed, _ := WithMode(configMap(kubeadmConfig), "config.conf", v1alpha1.ModeNFTables)
	changed.Data["config.conf"] = strings.Replace(changed.Data["config.conf"], "bindAddress: 0.0.0.0", "bindAddress: 198.18.0.1", 1)
	back, err := WithMode(changed, "config.conf", v1alpha1.ModeIPTables)
	if err != nil {
		t.Fatal(err)
	}
	text := back.Data["config.conf"]
	if !strings.Contains(text, "bindAddress: 198.18.0.1") || !strings.Contains(text, "mode: iptables") {
		t.Errorf("a person's edit was lost or the mode not set back:\n%s", text)
	}
}

func TestWithModeErrors(t *testing.T) {
	if _, err := WithMode(configMap(kubeadmConfig), "other.conf", v1alpha1.ModeNFTables); err == nil || !strings.Contains(err.Error(), `no key "other.conf"`) {
		t.Errorf("missing key: %v", err)
	}
	if _, err := WithMode(configMap("kind: KubeProxyConfiguration\nmode: kernelspace\n"), "config.conf", v1alpha1.ModeNFTables); err == nil {
		t.Error("a Windows mode was changed")
	}
}
