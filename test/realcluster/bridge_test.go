package realcluster

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
	"github.com/proxyshift/proxyshift/controllers/kubeproxyconfig"
	"github.com/proxyshift/proxyshift/test/e2e"
)

// changeKubeProxyMode applies spec.kubeProxy.mode and waits until the
// change is done, logging each change of the picture.
func changeKubeProxyMode(t *testing.T, c *Cluster, cl client.Client, name string, mode v1alpha1.ProxyMode) e2e.Snapshot {
	t.Helper()
	start := time.Now()
	gen, err := ApplyKubeProxyMode(t.Context(), cl, name, mode)
	if err != nil {
		t.Fatal(err)
	}
	deleteConfigAtEnd(t, cl, name)
	stage := ""
	s, err := e2e.WaitDone(t.Context(), cl, name, gen, 10*time.Minute, func(s e2e.Snapshot) {
		if b := s.Config.Status.KubeProxyBridge; b != nil && string(b.Stage) != stage {
			stage = string(b.Stage)
			t.Logf("%6.1fs stage %s (kube-proxy %s → %s, rolling back: %v)", time.Since(start).Seconds(), b.Stage, b.From, b.To, b.RollingBack)
		}
		t.Logf("%6.1fs %s", time.Since(start).Seconds(), s.Line())
	})
	if err != nil {
		t.Fatalf("%v\n%s", err, debugState(t, c))
	}
	t.Logf("timing: kube-proxy's mode to %-9s %6.2fs", mode, time.Since(start).Seconds())
	return s
}

// kubeProxyConfig is the file in kube-proxy's ConfigMap, and the ConfigMap's
// annotations.
func kubeProxyConfig(t *testing.T, c *Cluster) (string, map[string]string) {
	t.Helper()
	cm, err := c.Kube.CoreV1().ConfigMaps("kube-system").Get(t.Context(), "kube-proxy", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return cm.Data["config.conf"], cm.Annotations
}

// requireKubeProxyIn checks every node is served by kube-proxy in mode
// and nothing else: the ProxyNodes say so (one the final snapshot shows
// otherwise is logged and given a minute to settle), kube-proxy's /proxyMode says
// so and its sync metric moved after since (for every IP family), and
// the kernel holds kube-proxy's objects of that mode only (no KUBE-*
// chain in either iptables backend after a move to nftables, no
// kube-proxy table after a move to iptables) and none of proxyshift's.
func requireKubeProxyIn(t *testing.T, c *Cluster, s e2e.Snapshot, mode v1alpha1.ProxyMode, since time.Time) {
	t.Helper()
	servedBy := func(pn *v1alpha1.ProxyNode) error {
		if pn.Status.ActiveMode != v1alpha1.ModeKubeProxy || pn.Status.KubeProxyMode != mode || pn.Status.Phase != v1alpha1.NodeActive {
			return fmt.Errorf("%s (kube-proxy's objects: %s); want kube-proxy in %s, Active", e2e.NodeText(*pn), pn.Status.KubeProxyMode, mode)
		}
		return nil
	}
	for _, pn := range s.Nodes {
		err := servedBy(&pn)
		if err == nil {
			continue
		}
		// Seen once in CI: the change Completed on node-3's Active, and
		// the snapshot read right after it showed node-3 CleaningUp
		// again. Log what the cluster and the node show, then require
		// the node to settle, so that the next time says why.
		t.Logf("%s when the change ended: %v\n%s\n%s", pn.Name, err, debugState(t, c), nodeLogs(t, c, pn.Name))
		cl := proxyshiftClient(t, c)
		waitUntil(t, c, pn.Name+": served by kube-proxy in "+string(mode)+", Active", func(ctx context.Context) error {
			var cur v1alpha1.ProxyNode
			if err := cl.Get(ctx, client.ObjectKey{Name: pn.Name}, &cur); err != nil {
				return err
			}
			return servedBy(&cur)
		})
	}
	for _, n := range c.Nodes {
		waitUntil(t, c, n.Name+": kube-proxy answers /proxyMode "+string(mode)+" and has synced", func(ctx context.Context) error {
			code, body, err := n.NS.HTTPGet(ctx, "http://127.0.0.1:10249/proxyMode")
			if err != nil || code != 200 || body != string(mode) {
				return fmt.Errorf("/proxyMode: %d %q %v", code, body, err)
			}
			_, metrics, err := n.NS.HTTPGet(ctx, "http://127.0.0.1:10249/metrics")
			if err != nil {
				return err
			}
			synced := 0
			for _, line := range strings.Split(metrics, "\n") {
				if !strings.HasPrefix(line, "kubeproxy_sync_proxy_rules_last_timestamp_seconds") {
					continue
				}
				f := strings.Fields(line)
				v, err := strconv.ParseFloat(f[len(f)-1], 64)
				if err != nil || v < float64(since.Unix()) {
					return fmt.Errorf("not synced since the change started: %s", line)
				}
				synced++
			}
			if synced == 0 {
				return fmt.Errorf("no kubeproxy_sync_proxy_rules_last_timestamp_seconds in its metrics")
			}
			return nil
		})
		o, err := n.Objects(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if len(o.Proxyshift) > 0 {
			t.Errorf("%s: proxyshift's objects left: %v", n.Name, o.Proxyshift)
		}
		nft := slices.ContainsFunc(o.KubeProxy, func(s string) bool { return strings.HasPrefix(s, "nft ") })
		chains := slices.ContainsFunc(o.KubeProxy, func(s string) bool { return !strings.HasPrefix(s, "nft ") })
		if mode == v1alpha1.ModeNFTables && (!nft || chains) || mode == v1alpha1.ModeIPTables && (nft || !chains) {
			t.Errorf("%s: want only kube-proxy's %s objects, the kernel holds %v", n.Name, mode, o.KubeProxy)
		}
	}
}

// checkKubeProxyModeChange moves kube-proxy itself from iptables to
// nftables and back with proxyshift as the bridge, under the migration's
// traffic from pods on every node: after each move no connection failed,
// the long-lived ones answer, kube-proxy runs on every node in the new
// mode with only that mode's objects in the kernel, and its ConfigMap
// says the mode; the move back restores the ConfigMap byte for byte.
func checkKubeProxyModeChange(t *testing.T, c *Cluster, cl client.Client) {
	before, _ := kubeProxyConfig(t, c)
	all := nodeNames(c)
	traffic := startPodTraffic(t, c)
	placement := watchPlacement(t, c, cl)
	const name = "kube-proxy-mode"

	start := time.Now()
	s := changeKubeProxyMode(t, c, cl, name, v1alpha1.ModeNFTables)
	requireChanged(t, s, v1alpha1.ModeIPTables, v1alpha1.ModeNFTables)
	requirePlacement(t, c, all)
	requireKubeProxyIn(t, c, s, v1alpha1.ModeNFTables, start)
	text, ann := kubeProxyConfig(t, c)
	if got, err := kubeproxyconfig.Parse(text); err != nil || got.Mode != v1alpha1.ModeNFTables {
		t.Errorf("kube-proxy's ConfigMap says %+v (%v), want mode nftables", got, err)
	}
	if ann[kubeproxyconfig.AnnotationPrevious] != before {
		t.Errorf("the ConfigMap does not keep its previous file in %s", kubeproxyconfig.AnnotationPrevious)
	}
	traffic.check(t, "kube-proxy iptables → nftables")

	start = time.Now()
	s = changeKubeProxyMode(t, c, cl, name, v1alpha1.ModeIPTables)
	requireChanged(t, s, v1alpha1.ModeNFTables, v1alpha1.ModeIPTables)
	requirePlacement(t, c, all)
	requireKubeProxyIn(t, c, s, v1alpha1.ModeIPTables, start)
	if text, ann := kubeProxyConfig(t, c); text != before || ann[kubeproxyconfig.AnnotationPrevious] != "" {
		t.Errorf("kube-proxy's ConfigMap is not as it was:\n%s\nannotations %v", text, ann)
	}
	traffic.check(t, "kube-proxy nftables → iptables")
	placement.check(t)
	if err := cl.Delete(t.Context(), &v1alpha1.ProxyConfig{ObjectMeta: metav1.ObjectMeta{Name: name}}); err != nil {
		t.Fatal(err)
	}
}

// requireChanged checks the ProxyConfig completed the change from → to.
func requireChanged(t *testing.T, s e2e.Snapshot, from, to v1alpha1.ProxyMode) {
	t.Helper()
	st := s.Config.Status
	b := st.KubeProxyBridge
	if st.Phase != v1alpha1.RolloutCompleted || b == nil || b.Stage != v1alpha1.BridgeCompleted || b.RollingBack || b.From != from || b.To != to {
		t.Fatalf("the change ended %s with %+v (failed nodes %+v); want Completed from %s to %s", st.Phase, b, st.FailedNodes, from, to)
	}
}

// checkFailedKubeProxyModeChange makes handing a node back to kube-proxy
// in nftables mode fail (the agent hook --test-fail-hand-back-into): the
// canary fails once kube-proxy serves it in nftables mode, proxyshift
// takes it over again, the ConfigMap is restored, and every node ends on
// kube-proxy in iptables mode, under traffic without a failed connection.
func checkFailedKubeProxyModeChange(t *testing.T, c *Cluster, cl client.Client) {
	before, _ := kubeProxyConfig(t, c)
	setAgentArg(t, c, "--test-fail-hand-back-into=nftables", true)
	t.Cleanup(func() { setAgentArg(t, c, "--test-fail-hand-back-into=nftables", false) })
	traffic := startPodTraffic(t, c)
	const name = "kube-proxy-mode-fails"
	start := time.Now()
	s := changeKubeProxyMode(t, c, cl, name, v1alpha1.ModeNFTables)
	st := s.Config.Status
	b := st.KubeProxyBridge
	if st.Phase != v1alpha1.RolloutFailed || b == nil || !b.RollingBack || b.Stage != v1alpha1.BridgeCompleted || b.To != v1alpha1.ModeIPTables {
		t.Fatalf("the change ended %s with %+v; want Failed, rolled back to iptables", st.Phase, b)
	}
	if !strings.Contains(b.Failure, "on purpose") {
		t.Errorf("the failure %q does not say why", b.Failure)
	}
	t.Logf("rolled back: %s", b.Failure)
	all := nodeNames(c)
	requirePlacement(t, c, all)
	requireKubeProxyIn(t, c, s, v1alpha1.ModeIPTables, start)
	if text, ann := kubeProxyConfig(t, c); text != before || ann[kubeproxyconfig.AnnotationPrevious] != "" {
		t.Errorf("kube-proxy's ConfigMap is not restored:\n%s\nannotations %v", text, ann)
	}
	traffic.check(t, "a failed change of kube-proxy's mode")
	traffic.close()
	if err := cl.Delete(t.Context(), &v1alpha1.ProxyConfig{ObjectMeta: metav1.ObjectMeta{Name: name}}); err != nil {
		t.Fatal(err)
	}
}
