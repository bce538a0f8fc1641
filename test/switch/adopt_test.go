package switchtest

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	gnft "github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"

	"github.com/proxyshift/proxyshift/api/contract"
	"github.com/proxyshift/proxyshift/api/v1alpha1"
)

// installKubeProxy puts kube-proxy-style leftovers into the node: in
// iptables-legacy, a working kube-proxy iptables-mode rule set sending
// the web service's cluster IP to pod a (as if kube-proxy had run there
// until a moment ago); in iptables-nft, kube-proxy chains without rules;
// a kube-proxy nftables table; and a kube-proxy ipset. Next to them are
// objects that look alike but are not kube-proxy's: kubelet's chains, a
// kube-router chain and ipset, which must survive adoption. again puts
// kube-proxy's objects back after a takeover removed them (the others
// are still there).
func (w *world) installKubeProxy(again bool) {
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
	tables, ipsets := []string{"kube-proxy", "someone-else"}, []string{"KUBE-CLUSTER-IP", "KUBE-DST-FOREIGN"}
	if again {
		tables, ipsets = tables[:1], ipsets[:1]
	}
	for _, name := range tables {
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
	for _, name := range ipsets {
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

// setKubeProxyStopped writes spec.kubeProxyStopped, as the operator does
// once kube-proxy's pod has left the node (true) or is back (false).
func (w *world) setKubeProxyStopped(stopped bool) {
	w.t.Helper()
	for i := 0; ; i++ {
		pn := w.proxyNode()
		pn.Spec.KubeProxyStopped = stopped
		err := w.env.Client.Update(context.Background(), pn)
		if err == nil {
			return
		}
		if !apierrors.IsConflict(err) || i > 10 {
			w.t.Fatal(err)
		}
	}
}

// kubeProxyMetrics serves kube-proxy's metrics endpoint inside the node
// namespace, on 127.0.0.1, with a settable last sync time (0: none yet),
// as a kube-proxy pod that has just started would.
type kubeProxyMetrics struct {
	url      string
	lastSync atomic.Int64
}

func (w *world) serveKubeProxyMetrics() *kubeProxyMetrics {
	w.t.Helper()
	m := &kubeProxyMetrics{}
	var ln net.Listener
	if err := w.lab.Node.NS.NS().Do(func() error {
		var err error
		ln, err = net.Listen("tcp", "127.0.0.1:0")
		return err
	}); err != nil {
		w.t.Fatal(err)
	}
	m.url = "http://" + ln.Addr().String() + "/metrics"
	srv := &http.Server{Handler: http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {
		fmt.Fprintf(rw, "# TYPE kubeproxy_sync_proxy_rules_last_timestamp_seconds gauge\nkubeproxy_sync_proxy_rules_last_timestamp_seconds %d\n", m.lastSync.Load())
	})}
	go srv.Serve(ln)
	w.t.Cleanup(func() { srv.Close() })
	return m
}

// waitPhase waits until the agent reports phase with target as the
// desired mode's generation.
func (w *world) waitPhase(phase v1alpha1.NodePhase) *v1alpha1.ProxyNode {
	w.t.Helper()
	return w.waitStatus("phase "+string(phase), 60*time.Second, func(pn *v1alpha1.ProxyNode) bool { return pn.Status.Phase == phase })
}

// TestTakeoverAndHandBack walks one node through the agent's side of a
// takeover from kube-proxy and a hand-back, the operator's part played by
// the test (spec.desiredMode, spec.kubeProxyStopped), kube-proxy's by
// its rules (a working iptables-mode rule set sending the web service to
// pod a only, as if its pod had run until a moment ago) and a metrics
// endpoint:
//   - an agent with nothing desired (and the default --mode) leaves a
//     node kube-proxy serves alone and reports kube-proxy serving;
//   - asked for nftables, it programs and verifies it in front of
//     kube-proxy's rules and waits, touching none of them, until told
//     kube-proxy's pod left; then it removes kube-proxy's objects and
//     nothing that only looks like them (kubelet's chains, kube-router's
//     chain and ipset, another nftables table);
//   - asked for kube-proxy, it keeps serving until kube-proxy's rules are
//     back and its metrics say it synced, then removes its own objects;
//   - new connections never fail throughout.
func TestTakeoverAndHandBack(t *testing.T) {
	w := newWorld(t, "")
	w.installKubeProxy(false)
	// kube-proxy's rules serve the cluster IP and the NodePort (pod a
	// only).
	servedByKubeProxy := func() {
		t.Helper()
		for _, target := range []netip.AddrPort{w.clusterIP(), w.nodePort()} {
			if name, err := w.lab.Client.NS.Request("tcp", target, 2*time.Second); err != nil || name != w.pods[0].Name {
				t.Fatalf("kube-proxy's rules do not serve %s: %q %v", target, name, err)
			}
		}
	}
	servedByKubeProxy()
	before := w.kubeState()
	metrics := w.serveKubeProxyMetrics()

	loop := w.startClientLoop()
	w.startAgent("--mode=nftables", "--kube-proxy-metrics-url="+metrics.url)
	pn := w.waitStatus("kube-proxy reported serving", 30*time.Second, func(pn *v1alpha1.ProxyNode) bool {
		return pn.Status.Phase == v1alpha1.NodeIdle && pn.Status.ActiveMode == v1alpha1.ModeKubeProxy
	})
	if pn.Status.KubeProxyMode != v1alpha1.ModeNFTables {
		// The kube-proxy table makes it nftables (ahead of the KUBE-*
		// chains), as the agent reads kube-proxy's objects.
		t.Errorf("status.kubeProxyMode = %q, want nftables (its kube-proxy table is there)", pn.Status.KubeProxyMode)
	}
	time.Sleep(time.Second)
	if has, dump := w.holds(v1alpha1.ModeNFTables); has {
		t.Fatalf("an agent with nothing desired programmed nftables (--mode is only for a node nothing serves):\n%s", dump)
	}
	servedByKubeProxy()

	t.Log("takeover")
	w.desire(v1alpha1.ModeNFTables)
	pn = w.waitPhase(v1alpha1.NodeWaitingForKubeProxy)
	if c := meta.FindStatusCondition(pn.Status.Conditions, contract.ConditionReady); c == nil || !strings.Contains(c.Message, "waiting for kube-proxy's pod to leave") {
		t.Errorf("Ready while waiting for kube-proxy = %+v", c)
	}
	w.requireTraffic() // both pods: nftables, ahead, serves
	time.Sleep(2 * time.Second)
	if after := w.kubeState(); after != before {
		t.Errorf("kube-proxy's objects changed before its pod left:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	w.setKubeProxyStopped(true)
	pn = w.waitActive(v1alpha1.ModeNFTables)
	if pn.Status.KubeProxyMode != "" {
		t.Errorf("status.kubeProxyMode = %q after the takeover, want empty", pn.Status.KubeProxyMode)
	}
	loop.RequireNoFailures(t, "from kube-proxy to proxyshift")
	w.requireTraffic()
	got := w.kubeState()
	for _, gone := range []string{"KUBE-SERVICES", "KUBE-SVC-", "KUBE-SEP-", "KUBE-MARK-MASQ", "KUBE-POSTROUTING", "KUBE-FORWARD", "KUBE-NODEPORTS", "ip kube-proxy", "KUBE-CLUSTER-IP"} {
		if strings.Contains(got, gone) {
			t.Errorf("%s is still there after the takeover:\n%s", gone, got)
		}
	}
	for _, kept := range []string{
		":KUBE-FIREWALL", "-A INPUT -j KUBE-FIREWALL", "-A INPUT -j KUBE-ROUTER-INPUT", ":KUBE-ROUTER-INPUT",
		":KUBE-MARK-DROP", ":KUBE-KUBELET-CANARY", "ip someone-else", "KUBE-DST-FOREIGN",
	} {
		if !strings.Contains(got, kept) {
			t.Errorf("%q, not kube-proxy's, was removed:\n%s", kept, got)
		}
	}
	w.requireOnly(v1alpha1.ModeNFTables)
	s := w.waitStory(v1alpha1.ModeNFTables, "Preparing", "Programming", "Verifying", "WaitingForKubeProxy", "CleaningUp", "KubeProxyLeftoversRemoved", "Active")
	requireSaid(t, s, 0, "switching from kube-proxy to nftables")
	requireSaid(t, s, 3, "waiting for kube-proxy's pod to leave the node")
	requireSaid(t, s, 5, "removed kube-proxy's leftovers (", "KUBE-SERVICES")

	t.Log("hand-back")
	w.setKubeProxyStopped(false)
	w.desire(v1alpha1.ModeKubeProxy)
	w.waitPhase(v1alpha1.NodeWaitingForKubeProxy)
	w.installKubeProxy(true) // kube-proxy's pod is back and programs its rules...
	time.Sleep(3 * time.Second)
	if pn := w.proxyNode(); pn.Status.Phase != v1alpha1.NodeWaitingForKubeProxy {
		t.Fatalf("the agent stopped waiting before kube-proxy's metrics said it synced: %s", statusText(pn))
	}
	if has, _ := w.holds(v1alpha1.ModeNFTables); !has {
		t.Fatal("proxyshift's nftables rules were removed before kube-proxy synced")
	}
	metrics.lastSync.Store(time.Now().Unix()) // ...and says it synced
	pn = w.waitActive(v1alpha1.ModeKubeProxy)
	if pn.Status.KubeProxyMode == "" {
		t.Errorf("status.kubeProxyMode is empty with kube-proxy serving")
	}
	time.Sleep(300 * time.Millisecond)
	loop.RequireNoFailures(t, "from proxyshift back to kube-proxy")
	for _, m := range []v1alpha1.ProxyMode{v1alpha1.ModeIPTables, v1alpha1.ModeNFTables} {
		if has, dump := w.holds(m); has {
			t.Errorf("proxyshift's %s objects are left after the hand-back:\n%s", m, dump)
		}
	}
	servedByKubeProxy()
	s = w.waitStory(v1alpha1.ModeKubeProxy, "Preparing", "WaitingForKubeProxy", "KubeProxyServing", "CleaningUp", "CleanedUp", "Active")
	requireSaid(t, s, 0, "handing the node back to kube-proxy from nftables")
	requireSaid(t, s, 1, "waiting for kube-proxy's pod to come back and sync its rules; nftables keeps serving")
	requireSaid(t, s, 2, "kube-proxy synced its rules and serves the node again")
	requireSaid(t, s, 4, "removed the objects of nftables (")
	requireSaid(t, s, 5, "kube-proxy serves the node again")
}
