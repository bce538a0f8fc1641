package dataplane_test

import (
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/proxyshift/proxyshift/nodeagent/dataplane"
	"github.com/proxyshift/proxyshift/nodeagent/dataplane/forwarddrop"
	"github.com/proxyshift/proxyshift/nodeagent/dataplane/iptables"
	"github.com/proxyshift/proxyshift/nodeagent/model"
	"github.com/proxyshift/proxyshift/test/netlab"
)

// Hosts whose FORWARD policy is DROP (Docker sets it). Service traffic
// from the client to pods is forwarded by the node, and so are the pods'
// replies. kube-proxy's iptables mode accepts forwarded service traffic
// in iptables' FORWARD chain (KUBE-FORWARD); our iptables mode does the
// same (PROXYSHIFT-FORWARD). An accept in an nftables table of our own
// cannot overrule a drop policy of another base chain, so the nftables
// and IPVS modes cannot: they report the chains in a warning of every
// sync instead.

// TestForwardPolicyDrop sets the node namespace's filter FORWARD policy
// to DROP, in each iptables variant, and checks in every mode: that the
// lab then drops forwarded traffic (client to pod directly); that
// ClusterIP (TCP, UDP) and NodePort traffic from outside the pod networks works in the iptables mode of
// the same variant; and that the nftables and IPVS modes warn, naming
// the chain. The iptables mode of the other variant is not checked: its
// accept rules are in another table than the drop, which is what
// programming the variant the host uses (iptables.Detect) avoids.
func TestForwardPolicyDrop(t *testing.T) {
	netlab.RequireRoot(t)
	for _, policyIn := range []iptables.Variant{iptables.NFT, iptables.Legacy} {
		for _, row := range backends {
			rowVariant, isIPTables := strings.CutPrefix(row.name, "iptables-")
			if isIPTables && rowVariant != string(policyIn) {
				continue
			}
			t.Run("drop-in-"+string(policyIn)+"/"+row.name, func(t *testing.T) {
				skipHostRowInVM(t, row)
				if _, err := lookSbin("iptables-" + string(policyIn)); err != nil {
					t.Skipf("needs iptables-%s (Debian package iptables): %v", policyIn, err)
				}
				lab := netlab.NewLab(t)
				node := lab.Node
				row.skip(t, node.NS)
				p := pods{a: node.AddPod(t, "pod-a"), b: node.AddPod(t, "pod-b")}
				all := []string{"pod-a", "pod-b"}
				ports := forwardPorts(p)
				client := lab.Client.NS

				expectSpread(t, client, netlab.TCP, p.a.Addr(), []string{"pod-a"})
				if _, err := iptablesCmd(node.NS, policyIn, "", "-t", "filter", "-P", "FORWARD", "DROP"); err != nil {
					t.Fatal(err)
				}
				expectNotServed(t, client, p.a.Addr())

				b := row.new(t, node.NS, nodeConfig)
				_, err := b.Sync(t.Context(), dataplane.SyncRequest{Model: snapshot(ports), Full: true})
				warnings, rest := dataplane.SplitWarnings(err)
				if rest != nil {
					t.Fatalf("full sync: %v\n%s", err, row.dump(node.NS))
				}
				defer func() {
					if t.Failed() {
						t.Logf("state in the node namespace:\n%s", row.dump(node.NS))
					}
				}()
				web := netip.AddrPortFrom(webIP, 80)
				np := netip.AddrPortFrom(netlab.NodeIP, nodePort)
				if isIPTables {
					if len(warnings) > 0 {
						t.Errorf("iptables sync warns: %v", err)
					}
					expectSpread(t, client, netlab.TCP, web, all)
					expectSpread(t, client, netlab.UDP, netip.AddrPortFrom(dnsIP, 53), all)
					expectSpread(t, client, netlab.TCP, np, all)
					// Only service traffic is accepted: the host's policy
					// still holds for the rest. (So does a pod's own
					// traffic to a Service, which is not masqueraded,
					// as in kube-proxy: the pod networks' forwarding is
					// the CNI's to accept.)
					expectNotServed(t, client, p.a.Addr())
					// Cleanup removes the accept rules and leaves the
					// host's policy as it was.
					if _, err := b.Cleanup(t.Context()); err != nil {
						t.Fatalf("cleanup: %v", err)
					}
					out, err := iptablesCmd(node.NS, policyIn, "", "-t", "filter", "-S", "FORWARD")
					if err != nil {
						t.Fatal(err)
					}
					if strings.Contains(out, iptables.ChainPrefix) || !strings.Contains(out, "-P FORWARD DROP") {
						t.Errorf("filter FORWARD after cleanup:\n%s\nwant policy DROP and no rule of proxyshift's", out)
					}
					return
				}
				var w *forwarddrop.Warning
				if !errors.As(err, &w) {
					t.Fatalf("%s sync on a node dropping forwarded packets: %v; want a *forwarddrop.Warning", row.name, err)
				}
				t.Logf("warning: %v", w)
				want := "nftables ip filter FORWARD"
				if policyIn == iptables.Legacy {
					want = "iptables-legacy filter FORWARD"
				}
				if !slices.Contains(w.LeftAlone(), want) {
					t.Errorf("warning names %q; want %q among them", w.LeftAlone(), want)
				}
				// What the warning says: the service is not reached.
				expectNotServed(t, client, web)
				// Once the host accepts forwarded traffic, it works, and
				// the next full sync no longer warns.
				if _, err := iptablesCmd(node.NS, policyIn, "", "-t", "filter", "-P", "FORWARD", "ACCEPT"); err != nil {
					t.Fatal(err)
				}
				if _, err := b.Sync(t.Context(), dataplane.SyncRequest{Model: snapshot(ports), Full: true}); err != nil {
					t.Errorf("full sync with FORWARD policy ACCEPT: %v", err)
				}
				expectSpread(t, client, netlab.TCP, web, all)
			})
		}
	}
}

// forwardPorts are the suite's services web (ClusterIP, TCP), dns
// (ClusterIP, UDP) and nodeport, each with endpoints pod-a and pod-b.
func forwardPorts(p pods) map[model.ServicePortName]*model.ServicePort {
	out := nodePortOnly(p)
	for _, sp := range []*model.ServicePort{
		{Name: model.ServicePortName{Namespace: "suite", Name: "web", Port: "p", Protocol: corev1.ProtocolTCP}, ClusterIP: webIP, Protocol: corev1.ProtocolTCP, Port: 80},
		{Name: model.ServicePortName{Namespace: "suite", Name: "dns", Port: "p", Protocol: corev1.ProtocolUDP}, ClusterIP: dnsIP, Protocol: corev1.ProtocolUDP, Port: 53},
	} {
		sp.Family = corev1.IPv4Protocol
		sp.Endpoints = []model.Endpoint{endpoint(ipv4, p.a, true), endpoint(ipv4, p.b, true)}
		out[sp.Name] = sp
	}
	return out
}
