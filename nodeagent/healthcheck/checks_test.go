package healthcheck

import (
	"net/netip"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
	"github.com/proxyshift/proxyshift/nodeagent/model"
	"github.com/proxyshift/proxyshift/nodeagent/report"
)

func ep(ip string, local, ready, serving, terminating bool) model.Endpoint {
	return model.Endpoint{IP: netip.MustParseAddr(ip), Port: 8080, IsLocal: local, Ready: ready, Serving: serving, Terminating: terminating}
}

func port(ns, name, portName string, hc int32, eps ...model.Endpoint) *model.ServicePort {
	n := model.ServicePortName{Namespace: ns, Name: name, Port: portName, Protocol: corev1.ProtocolTCP}
	return &model.ServicePort{Name: n, HealthCheckNodePort: hc, ExternalPolicyLocal: hc != 0, Endpoints: eps}
}

func snapshot(ports map[corev1.IPFamily][]*model.ServicePort) *model.Snapshot {
	s := &model.Snapshot{Ports: map[corev1.IPFamily]map[model.ServicePortName]*model.ServicePort{}}
	for fam, ps := range ports {
		s.Ports[fam] = map[model.ServicePortName]*model.ServicePort{}
		for _, p := range ps {
			s.Ports[fam][p.Name] = p
		}
	}
	return s
}

// TestChecks: one check per Service and family with a health-check node
// port, counting the distinct addresses of ready endpoints on this node
// over all the Service's ports, as kube-proxy counts them.
func TestChecks(t *testing.T) {
	snap := snapshot(map[corev1.IPFamily][]*model.ServicePort{
		corev1.IPv4Protocol: {
			// Two ports, the same two local pods: 2, not 4. A remote
			// endpoint and a local terminating one do not count.
			port("shop", "front", "http", 32000,
				ep("198.18.1.1", true, true, true, false), ep("198.18.1.2", true, true, true, false),
				ep("198.18.2.1", false, true, true, false), ep("198.18.1.3", true, false, true, true)),
			port("shop", "front", "https", 32000,
				ep("198.18.1.1", true, true, true, false), ep("198.18.1.2", true, true, true, false)),
			// Only terminating local endpoints: traffic drains to them,
			// the check fails.
			port("shop", "draining", "", 32001, ep("198.18.1.4", true, false, true, true)),
			// No local endpoint.
			port("a", "remote", "", 32002, ep("198.18.2.2", false, true, true, false)),
			// No health-check node port: no check.
			port("shop", "cluster", "", 0, ep("198.18.1.1", true, true, true, false)),
		},
		corev1.IPv6Protocol: {
			port("shop", "front", "http", 32000, ep("2001:db8::1", true, true, true, false)),
		},
	})
	got := Checks(snap)
	key := func(ns, name string, f corev1.IPFamily) CheckKey {
		return CheckKey{Service: model.ServiceName{Namespace: ns, Name: name}, Family: f}
	}
	want := []Check{
		{CheckKey: key("a", "remote", corev1.IPv4Protocol), Port: 32002, LocalEndpoints: 0},
		{CheckKey: key("shop", "draining", corev1.IPv4Protocol), Port: 32001, LocalEndpoints: 0},
		{CheckKey: key("shop", "front", corev1.IPv4Protocol), Port: 32000, LocalEndpoints: 2},
		{CheckKey: key("shop", "front", corev1.IPv6Protocol), Port: 32000, LocalEndpoints: 1},
	}
	if !slices.Equal(got, want) {
		t.Errorf("Checks =\n%+v\nwant\n%+v", got, want)
	}
	if Checks(nil) != nil {
		t.Error("Checks(nil) is not empty")
	}
}

// TestListenAddrs: unrestricted NodePort addresses listen on the
// family's wildcard; restricted ones on the family's addresses only.
func TestListenAddrs(t *testing.T) {
	ips := []netip.Addr{netip.MustParseAddr("198.18.0.2"), netip.MustParseAddr("2001:db8::1"), netip.MustParseAddr("198.18.0.1")}
	for _, tc := range []struct {
		name    string
		family  corev1.IPFamily
		nodeIPs []netip.Addr
		want    []string
	}{
		{"all, IPv4", corev1.IPv4Protocol, nil, []string{"0.0.0.0:32000"}},
		{"all, IPv6", corev1.IPv6Protocol, nil, []string{"[::]:32000"}},
		{"restricted, IPv4", corev1.IPv4Protocol, ips, []string{"198.18.0.1:32000", "198.18.0.2:32000"}},
		{"restricted, IPv6", corev1.IPv6Protocol, ips, []string{"[2001:db8::1]:32000"}},
		{"restricted to the other family", corev1.IPv6Protocol, ips[:1], nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, a := range ListenAddrs(tc.family, tc.nodeIPs, 32000) {
				got = append(got, a.String())
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("ListenAddrs = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestNodeEligible: a node is eligible unless unknown, being deleted, or
// tainted by the cluster autoscaler for deletion.
func TestNodeEligible(t *testing.T) {
	now := metav1.NewTime(time.Now())
	for _, tc := range []struct {
		name string
		node *corev1.Node
		want bool
	}{
		{"unknown", nil, false},
		{"plain", &corev1.Node{}, true},
		{"other taint", &corev1.Node{Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: "node.kubernetes.io/unschedulable", Effect: corev1.TaintEffectNoSchedule}}}}, true},
		{"to be deleted", &corev1.Node{Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: ToBeDeletedTaint, Effect: corev1.TaintEffectNoSchedule}}}}, false},
		{"being deleted", &corev1.Node{ObjectMeta: metav1.ObjectMeta{DeletionTimestamp: &now}}, false},
	} {
		if got := NodeEligible(tc.node); got != tc.want {
			t.Errorf("%s: NodeEligible = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestServing: the ports are proxyshift's only while a proxyshift mode
// serves, kube-proxy is gone, and no hand-back has begun.
func TestServing(t *testing.T) {
	const (
		kp  = v1alpha1.ModeKubeProxy
		nft = v1alpha1.ModeNFTables
		ipt = v1alpha1.ModeIPTables
	)
	for _, tc := range []struct {
		name    string
		sw      report.Switch
		stopped bool
		want    bool
	}{
		{"nothing decided yet", report.Switch{}, false, false},
		{"kube-proxy serves", report.Switch{Phase: v1alpha1.NodeIdle, Active: kp, Target: kp, KubeProxyMode: ipt}, false, false},
		{"takeover programming", report.Switch{Phase: v1alpha1.NodeProgramming, Active: kp, Target: nft, KubeProxyMode: ipt}, false, false},
		{"takeover waiting for kube-proxy to leave", report.Switch{Phase: v1alpha1.NodeWaitingForKubeProxy, Active: kp, Target: nft, KubeProxyMode: ipt}, false, false},
		{"takeover cleaning up", report.Switch{Phase: v1alpha1.NodeCleaningUp, Active: kp, Target: nft, KubeProxyMode: ipt}, true, false},
		{"taken over", report.Switch{Phase: v1alpha1.NodeActive, Active: nft, Target: nft}, true, true},
		{"taken over, leftovers not removed", report.Switch{Phase: v1alpha1.NodeActive, Active: nft, Target: nft, KubeProxyMode: ipt}, true, true},
		{"kube-proxy's objects back, not stopped", report.Switch{Phase: v1alpha1.NodeActive, Active: nft, Target: nft, KubeProxyMode: ipt}, false, false},
		{"a node nothing served", report.Switch{Phase: v1alpha1.NodeActive, Active: nft, Target: nft}, false, true},
		{"between proxyshift modes", report.Switch{Phase: v1alpha1.NodeVerifying, Active: nft, Target: ipt}, false, true},
		{"hand-back preparing", report.Switch{Phase: v1alpha1.NodePreparing, Active: nft, Target: kp}, false, false},
		{"hand-back waiting for kube-proxy", report.Switch{Phase: v1alpha1.NodeWaitingForKubeProxy, Active: nft, Target: kp}, false, false},
		{"handed back", report.Switch{Phase: v1alpha1.NodeActive, Active: kp, Target: kp, KubeProxyMode: nft}, false, false},
		{"failed switch back on nftables", report.Switch{Phase: v1alpha1.NodeFailed, Active: nft, Target: nft}, false, true},
	} {
		if got := Serving(tc.sw, tc.stopped); got != tc.want {
			t.Errorf("%s: Serving = %v, want %v", tc.name, got, tc.want)
		}
	}
}
