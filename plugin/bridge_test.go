package plugin

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
)

func TestKubeProxyRollbackSpec(t *testing.T) {
	cfg := func(to v1alpha1.ProxyMode, b *v1alpha1.KubeProxyBridgeStatus) *v1alpha1.ProxyConfig {
		c := &v1alpha1.ProxyConfig{ObjectMeta: metav1.ObjectMeta{Name: "kp", Generation: 2}}
		c.Spec.Mode = v1alpha1.ModeKubeProxy
		c.Spec.KubeProxy = &v1alpha1.KubeProxyModeChange{Mode: to, Bridge: v1alpha1.ModeIPTables}
		c.Status.KubeProxyBridge = b
		return c
	}
	running := &v1alpha1.KubeProxyBridgeStatus{ObservedGeneration: 2, Stage: v1alpha1.BridgeHandingBack, From: v1alpha1.ModeIPTables, To: v1alpha1.ModeNFTables}
	spec, err := KubeProxyRollbackSpec(cfg(v1alpha1.ModeNFTables, running))
	if err != nil || spec.KubeProxy.Mode != v1alpha1.ModeIPTables || spec.KubeProxy.Bridge != v1alpha1.ModeIPTables || spec.Mode != v1alpha1.ModeKubeProxy {
		t.Errorf("rollback spec %+v, %v; want kubeProxy.mode iptables, the rest kept", spec.KubeProxy, err)
	}
	rolling := *running
	rolling.RollingBack, rolling.To, rolling.Failure = true, v1alpha1.ModeIPTables, "node-1 failed"
	for _, tc := range []struct {
		name string
		c    *v1alpha1.ProxyConfig
		want string
	}{
		{"not taken up", cfg(v1alpha1.ModeNFTables, nil), "not taken up"},
		{"older generation", cfg(v1alpha1.ModeNFTables, &v1alpha1.KubeProxyBridgeStatus{ObservedGeneration: 1}), "generation 2"},
		{"rolling back already", cfg(v1alpha1.ModeNFTables, &rolling), "already rolls the change back to kube-proxy in iptables mode (it failed: node-1 failed)"},
		{"back already", cfg(v1alpha1.ModeIPTables, running), "is iptables already"},
	} {
		if _, err := KubeProxyRollbackSpec(tc.c); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error saying %q", tc.name, err, tc.want)
		}
	}
}

func TestRenderStatusShowsTheBridge(t *testing.T) {
	c := v1alpha1.ProxyConfig{ObjectMeta: metav1.ObjectMeta{Name: "kp"}, Spec: v1alpha1.ProxyConfigSpec{Mode: v1alpha1.ModeKubeProxy}}
	c.Status.KubeProxyBridge = &v1alpha1.KubeProxyBridgeStatus{Stage: v1alpha1.BridgeTakingOver, From: v1alpha1.ModeNFTables, To: v1alpha1.ModeIPTables,
		Bridge: v1alpha1.ModeNFTables, ConfigMap: "kube-system/kube-proxy:config.conf", RollingBack: true, Failure: "node node-1 failed: on purpose"}
	var out strings.Builder
	if err := RenderStatus(&out, []v1alpha1.ProxyConfig{c}, nil, time.Now()); err != nil {
		t.Fatal(err)
	}
	want := "kube-proxy nftables -> iptables, bridged by proxyshift nftables: stage TakingOver (ConfigMap kube-system/kube-proxy:config.conf), rolling back: node node-1 failed: on purpose"
	if !strings.Contains(out.String(), want) {
		t.Errorf("status lacks %q:\n%s", want, out.String())
	}
}
