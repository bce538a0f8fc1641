package agent

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestNodePortIPs(t *testing.T) {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}, Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{
		{Type: corev1.NodeHostName, Address: "n1"},
		{Type: corev1.NodeInternalIP, Address: "198.18.0.1"},
		{Type: corev1.NodeInternalIP, Address: "198.18.0.9"},
		{Type: corev1.NodeExternalIP, Address: "198.19.9.9"},
		{Type: corev1.NodeInternalIP, Address: "fd00::1"},
	}}}
	local := []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("198.18.0.1"), netip.MustParseAddr("198.18.1.1"), netip.MustParseAddr("fd00::1")}
	cases := []struct {
		name    string
		spec    []string
		node    *corev1.Node
		want    []string
		wantErr string
	}{
		{"empty means any local address", nil, node, nil, ""},
		{"primary takes the first InternalIP per family", []string{"primary"}, node, []string{"198.18.0.1", "fd00::1"}, ""},
		{"primary without a Node", []string{"primary"}, nil, nil, "Node object is not known"},
		{"primary without an InternalIP or ExternalIP", []string{"primary"}, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "bare"}}, nil, "Node bare has no InternalIP or ExternalIP"},
		{"CIDRs select local addresses", []string{"198.18.0.0/24", "fd00::/64"}, nil, []string{"198.18.0.1", "fd00::1"}, ""},
		{"CIDR with host bits", []string{"198.18.1.7/24"}, nil, []string{"198.18.1.1"}, ""},
		{"no local address in the CIDRs", []string{"198.19.0.0/16"}, nil, nil, "no local address lies in"},
		{"garbage", []string{"eth0"}, nil, nil, `"eth0" is not a CIDR`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := NodePortIPs(tc.spec, tc.node, local)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var gotS []string
			for _, ip := range got {
				gotS = append(gotS, ip.String())
			}
			if !slices.Equal(gotS, tc.want) {
				t.Fatalf("got %v, want %v", gotS, tc.want)
			}
		})
	}
}

func TestPrimaryIPs(t *testing.T) {
	addrs := func(as ...corev1.NodeAddress) *corev1.Node {
		return &corev1.Node{Status: corev1.NodeStatus{Addresses: as}}
	}
	internal := func(ip string) corev1.NodeAddress {
		return corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: ip}
	}
	external := func(ip string) corev1.NodeAddress {
		return corev1.NodeAddress{Type: corev1.NodeExternalIP, Address: ip}
	}
	cases := []struct {
		name string
		node *corev1.Node
		want []netip.Addr
	}{
		{"no Node", nil, nil},
		{"the first InternalIP of each family", addrs(external("198.19.9.9"), internal("198.18.0.1"), internal("198.18.0.9"), internal("fd00::1")),
			[]netip.Addr{netip.MustParseAddr("198.18.0.1"), netip.MustParseAddr("fd00::1")}},
		{"an ExternalIP for a family without InternalIP", addrs(external("fd00::9"), internal("::ffff:198.18.0.1"), external("198.19.9.9")),
			[]netip.Addr{netip.MustParseAddr("198.18.0.1"), netip.MustParseAddr("fd00::9")}},
		{"hostname only", addrs(corev1.NodeAddress{Type: corev1.NodeHostName, Address: "n1"}), nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := PrimaryIPs(tc.node); !slices.Equal(got, tc.want) {
				t.Errorf("PrimaryIPs = %v, want %v", got, tc.want)
			}
		})
	}
}
