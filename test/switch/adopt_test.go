package switchtest

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	gnft "github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
)

// installKubeProxy puts kube-proxy-style leftovers into the node: in
// iptables-legacy, a working kube-proxy iptables-mode rule set sending
// the web service's cluster IP to pod a (as if kube-proxy had run there
// until a moment ago); in iptables-nft, kube-proxy chains without rules;
// a kube-proxy nftables table; and a kube-proxy ipset. Next to them are
// objects that look alike but are not kube-proxy's: kubelet's chains, a
// kube-router chain and ipset, which must survive adoption.
func (w *world) installKubeProxy() {
	w.t.Helper()
	ns := w.lab.Node.NS.NS()
	legacy := fmt.Sprintf(`*nat
:KUBE-SERVICES - [0:0]
:KUBE-SVC-WEB0000000000000 - [0:0]
:KUBE-SEP-PODA000000000000 - [0:0]
:KUBE-NODEPORTS - [0:0]
:KUBE-MARK-MASQ - [0:0]
:KUBE-POSTROUTING - [0:0]
:KUBE-MARK-DROP - [0:0]
:KUBE-KUBELET-CANARY - [0:0]
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING
-A KUBE-SERVICES -d %s/32 -p tcp -m comment --comment "default/web:p cluster IP" -m tcp --dport 80 -j KUBE-SVC-WEB0000000000000
-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS
-A KUBE-NODEPORTS -p tcp -m comment --comment "default/web:p" -m tcp --dport %d -j KUBE-SVC-WEB0000000000000
-A KUBE-SVC-WEB0000000000000 -j KUBE-SEP-PODA000000000000
-A KUBE-SEP-PODA000000000000 -p tcp -m tcp -j DNAT --to-destination %s:8080
-A KUBE-POSTROUTING -j RETURN
COMMIT
*filter
:KUBE-FIREWALL - [0:0]
:KUBE-FORWARD - [0:0]
:KUBE-ROUTER-INPUT - [0:0]
-A INPUT -j KUBE-FIREWALL
-A INPUT -j KUBE-ROUTER-INPUT
-A FORWARD -m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD
COMMIT
`, webIP, webNodePrt, w.pods[0].IP)
	nft := `*nat
:KUBE-SERVICES - [0:0]
:KUBE-NODEPORTS - [0:0]
:KUBE-KUBELET-CANARY - [0:0]
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A KUBE-SERVICES -j KUBE-NODEPORTS
COMMIT
`
	for bin, input := range map[string]string{"iptables-legacy-restore": legacy, "iptables-nft-restore": nft} {
		if _, err := ns.Output(context.Background(), []byte(input), bin, "--noflush"); err != nil {
			w.t.Fatalf("%s: %v", bin, err)
		}
	}
	c, err := gnft.New(gnft.WithNetNSFd(w.lab.Node.NS.FD()))
	if err != nil {
		w.t.Fatal(err)
	}
	for _, name := range []string{"kube-proxy", "someone-else"} {
		tab := c.AddTable(&gnft.Table{Name: name, Family: gnft.TableFamilyIPv4})
		c.AddChain(&gnft.Chain{Name: "services", Table: tab})
	}
	if err := c.Flush(); err != nil {
		w.t.Fatal(err)
	}
	h, err := netlink.NewHandleAt(w.lab.Node.NS.Handle, unix.NETLINK_NETFILTER)
	if err != nil {
		w.t.Fatal(err)
	}
	defer h.Close()
	for _, name := range []string{"KUBE-CLUSTER-IP", "KUBE-DST-FOREIGN"} {
		if err := h.IpsetCreate(name, "hash:ip", netlink.IpsetCreateOptions{}); err != nil {
			w.t.Fatalf("ipset %s: %v", name, err)
		}
	}
}

func (w *world) ipsets() []string {
	w.t.Helper()
	h, err := netlink.NewHandleAt(w.lab.Node.NS.Handle, unix.NETLINK_NETFILTER)
	if err != nil {
		w.t.Fatal(err)
	}
	defer h.Close()
	sets, err := h.IpsetListAll()
	if err != nil {
		w.t.Fatal(err)
	}
	var out []string
	for _, s := range sets {
		out = append(out, s.SetName)
	}
	slices.Sort(out)
	return out
}

// kubeLines are the iptables-save lines naming KUBE- chains, and the
// nftables tables, and the ipsets: everything the adoption test looks at.
func (w *world) kubeState() string {
	save := w.iptablesSave()
	var b strings.Builder
	section := ""
	for _, l := range strings.Split(save, "\n") {
		if strings.HasPrefix(l, "== ") || strings.HasPrefix(l, "*") {
			section = l
		}
		if strings.Contains(l, "KUBE-") {
			fmt.Fprintf(&b, "%s | %s\n", section, l)
		}
	}
	for _, o := range w.nftObjects() {
		if strings.HasPrefix(o, "ip kube-proxy") || strings.HasPrefix(o, "ip someone-else") {
			fmt.Fprintf(&b, "nft %s\n", o)
		}
	}
	fmt.Fprintf(&b, "ipsets %v\n", w.ipsets())
	return b.String()
}

// TestAdoptionFromKubeProxy: kube-proxy's leftovers (in both iptables
// variants, its nftables table, its ipsets) are left alone by an agent
// that is not adopting the node, and removed, once the desired mode is
// verified, by one started with --adopt-kube-proxy. Look-alikes that are
// not kube-proxy's (kubelet's chains, kube-router's chain and ipset,
// another nftables table) stay. New connections never fail: kube-proxy's
// rules serve until proxyshift's nftables rules, ordered ahead, take over.
func TestAdoptionFromKubeProxy(t *testing.T) {
	w := newWorld(t, v1alpha1.ModeNFTables)
	w.installKubeProxy()
	// kube-proxy's rules serve the cluster IP and the NodePort (pod a
	// only).
	for _, target := range []netip.AddrPort{w.clusterIP(), w.nodePort()} {
		if name, err := w.lab.Client.NS.Request("tcp", target, 2*time.Second); err != nil || name != w.pods[0].Name {
			t.Fatalf("kube-proxy's rules do not serve %s: %q %v", target, name, err)
		}
	}
	before := w.kubeState()

	loop := w.startClientLoop()
	a := w.startAgent()
	w.waitActive(v1alpha1.ModeNFTables)
	w.requireTraffic()
	if after := w.kubeState(); after != before {
		t.Errorf("an agent that is not adopting touched kube-proxy's objects:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	a.stop()

	a = w.startAgent("--adopt-kube-proxy")
	a.waitLog("Removed kube-proxy's leftovers", 60*time.Second)
	w.waitActive(v1alpha1.ModeNFTables)
	time.Sleep(300 * time.Millisecond)
	loop.RequireNoFailures(t, "from kube-proxy to proxyshift")
	w.requireTraffic()

	got := w.kubeState()
	for _, gone := range []string{"KUBE-SERVICES", "KUBE-SVC-", "KUBE-SEP-", "KUBE-MARK-MASQ", "KUBE-POSTROUTING", "KUBE-FORWARD", "KUBE-NODEPORTS", "ip kube-proxy", "KUBE-CLUSTER-IP"} {
		if strings.Contains(got, gone) {
			t.Errorf("%s is still there after adoption:\n%s", gone, got)
		}
	}
	for _, kept := range []string{
		"iptables-legacy-save\n | :KUBE-FIREWALL", "-A INPUT -j KUBE-FIREWALL", "-A INPUT -j KUBE-ROUTER-INPUT", ":KUBE-ROUTER-INPUT",
		":KUBE-MARK-DROP", ":KUBE-KUBELET-CANARY", "ip someone-else", "KUBE-DST-FOREIGN",
	} {
		if !strings.Contains(got, strings.TrimPrefix(kept, "iptables-legacy-save\n | ")) {
			t.Errorf("%q, not kube-proxy's, was removed:\n%s", kept, got)
		}
	}
	w.requireOnly(v1alpha1.ModeNFTables)
}
