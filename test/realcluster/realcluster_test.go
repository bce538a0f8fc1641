package realcluster

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/proxyshift/proxyshift/test/controlplane"
	"github.com/proxyshift/proxyshift/test/netlab"
)

// requests is how many new connections each way into the Service gets per
// check: with 3 pods chosen at random, all answering from one pod has a
// probability of 3·(1/3)^30.
const requests = 30

// TestRealCluster brings the 3-node cluster up, shows kube-proxy in
// iptables mode serving the Deployment's Services from every node with
// real connections, relabels a pod out of its Service and shows it leave
// the EndpointSlice, every node's kube-proxy rules and the traffic, then
// tears the cluster down and checks nothing is left.
func TestRealCluster(t *testing.T) {
	if err := CanRun(); err != nil {
		t.Skipf("this machine cannot run kubelets: %v", err)
	}
	hostSysctls := readHostSysctls(t)
	c, err := Start(t.Context(), Options{Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	t.Cleanup(func() {
		if !closed {
			if err := c.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
		}
	})
	for _, tm := range c.Timings {
		t.Logf("timing: %-30s %6.2fs", tm.Step, tm.Duration.Seconds())
	}
	for _, tm := range c.Pods {
		t.Logf("timing: pod %-26s %6.2fs to Running", tm.Step, tm.Duration.Seconds())
	}

	t.Run("nodes", func(t *testing.T) { checkNodes(t, c) })
	t.Run("host untouched", func(t *testing.T) {
		// The kubelets set these; each node's mount namespace gave them a
		// file to write instead.
		if now := readHostSysctls(t); !maps.Equal(now, hostSysctls) {
			t.Errorf("host sysctls changed: before %v, now %v", hostSysctls, now)
		}
		for _, n := range c.Nodes {
			out, err := n.Exec(t.Context(), "cat", "/proc/sys/vm/overcommit_memory")
			if err != nil || strings.TrimSpace(string(out)) != "1" {
				t.Errorf("%s: vm.overcommit_memory inside the node is %q (%v), want the kubelet's 1", n.Name, out, err)
			}
		}
	})
	t.Run("kube-proxy serves every node", func(t *testing.T) { checkTraffic(t, c, "") })
	t.Run("pods reach the Services and the API server", func(t *testing.T) { checkFromPods(t, c) })
	t.Run("relabelled pod leaves slice, rules and traffic", func(t *testing.T) { checkRelabel(t, c) })
	if !t.Run("proxyshift installed from config/local", func(t *testing.T) { checkInstall(t, c) }) {
		t.FailNow()
	}
	t.Run("a takeover that fails verification goes back to kube-proxy", func(t *testing.T) { checkFailedTakeover(t, c, proxyshiftClient(t, c)) })
	t.Run("kube-proxy → nftables → iptables → kube-proxy under traffic", func(t *testing.T) { checkMigration(t, c, proxyshiftClient(t, c)) })
	t.Run("kube-proxy iptables → nftables → iptables, bridged, under traffic", func(t *testing.T) { checkKubeProxyModeChange(t, c, proxyshiftClient(t, c)) })
	t.Run("a failed change of kube-proxy's mode goes back to iptables", func(t *testing.T) { checkFailedKubeProxyModeChange(t, c, proxyshiftClient(t, c)) })

	// What Leftovers finds while the cluster runs: each node's processes
	// (its PID namespace) and cgroup, the namespaces.
	running := strings.Join(c.Leftovers(), "\n")
	for _, n := range c.Nodes {
		for _, want := range []string{"(kubelet) in " + n.Name, "(containerd) in " + n.Name, "cgroup " + n.cfg.CgroupRoot, "network namespace " + n.NS.Name} {
			if !strings.Contains(running, want) {
				t.Errorf("Leftovers of the running cluster lack %q:\n%s", want, running)
			}
		}
	}
	if err := c.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	closed = true
	if now := readHostSysctls(t); !maps.Equal(now, hostSysctls) {
		t.Errorf("host sysctls changed: before %v, after %v", hostSysctls, now)
	}
	if left := c.Leftovers(); len(left) > 0 {
		t.Errorf("left on the machine after Close:\n  %s", strings.Join(left, "\n  "))
	}
}

// checkNodes checks that every node is a Ready kubelet v1.37.2 on
// containerd 2.4.2 with its address, and runs one kube-proxy pod, in
// iptables mode.
func checkNodes(t *testing.T, c *Cluster) {
	ctx := t.Context()
	nodes, err := c.Kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(nodes.Items) != len(c.Nodes) {
		t.Fatalf("%d Nodes, want %d", len(nodes.Items), len(c.Nodes))
	}
	for _, node := range nodes.Items {
		n := c.Node(node.Name)
		if n == nil {
			t.Errorf("unexpected Node %s", node.Name)
			continue
		}
		info := node.Status.NodeInfo
		if info.KubeletVersion != "v1.37.2" || info.ContainerRuntimeVersion != "containerd://2.4.2" {
			t.Errorf("%s: kubelet %q, runtime %q; want v1.37.2 and containerd://2.4.2", node.Name, info.KubeletVersion, info.ContainerRuntimeVersion)
		}
		var internal []string
		for _, a := range node.Status.Addresses {
			if a.Type == corev1.NodeInternalIP {
				internal = append(internal, a.Address)
			}
		}
		if !slices.Equal(internal, []string{n.IP.String()}) {
			t.Errorf("%s: InternalIP %v, want %s", node.Name, internal, n.IP)
		}
	}
	pods, err := c.Kube.CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{LabelSelector: KubeProxySelector})
	if err != nil {
		t.Fatal(err)
	}
	perNode := map[string]int{}
	for _, p := range pods.Items {
		perNode[p.Spec.NodeName]++
	}
	for _, n := range c.Nodes {
		if perNode[n.Name] != 1 {
			t.Errorf("%s runs %d kube-proxy pods, want 1", n.Name, perNode[n.Name])
		}
		// kube-proxy's metrics endpoint, on the node's loopback, names
		// the mode it runs in.
		code, body, err := n.NS.HTTPGet(ctx, "http://127.0.0.1:10249/proxyMode")
		if err != nil || code != 200 || body != "iptables" {
			t.Errorf("%s: kube-proxy /proxyMode: %d %q %v; want iptables", n.Name, code, body, err)
		}
	}
}

// checkTraffic opens new connections through every way into the web
// Services (the cluster IP from every node and from the client, the
// NodePort of every node from the client) and checks each is answered by
// a pod the Service selects (never by excluded), by more than one pod.
func checkTraffic(t *testing.T, c *Cluster, excluded string) {
	ctx := t.Context()
	pods, err := c.WebPods(ctx)
	if err != nil {
		t.Fatal(err)
	}
	targets, err := c.WebTargets(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, tg := range targets {
		tally := tg.NS.Spread(netlab.TCP, tg.Addr, requests, 2*time.Second)
		t.Logf("%-8s → %-20s %s", tg.From, tg.Addr, tally)
		if tally.Answered() != requests {
			t.Errorf("%s → %s: %d of %d requests answered (first failure: %v)", tg.From, tg.Addr, tally.Answered(), requests, tally.FirstErr)
		}
		for _, name := range tally.Names() {
			if _, ok := pods[name]; !ok || name == excluded {
				t.Errorf("%s → %s answered by %q, not a pod the Service selects (%v)", tg.From, tg.Addr, name, slices.Sorted(maps.Keys(pods)))
			}
		}
		if len(pods) > 1 && len(tally.Names()) < 2 {
			t.Errorf("%s → %s: every answer from %v; kube-proxy should spread new connections", tg.From, tg.Addr, tally.Names())
		}
	}
}

// checkFromPods sends traffic from inside each web pod: through the web
// Service's cluster IP, answered by every pod including the sender itself
// (hairpin through its own node's bridge, which needs the bridge netfilter
// hook on in the node's namespace), and to the API server through the
// kubernetes Service, as in-cluster clients (the operator) reach it.
func checkFromPods(t *testing.T, c *Cluster) {
	ctx := t.Context()
	pods, err := c.WebPods(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ip, err := c.ClusterIP(ctx, WorkloadNamespace, WebService)
	if err != nil {
		t.Fatal(err)
	}
	kubernetes, err := c.ClusterIP(ctx, "default", "kubernetes")
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(c.Config.TLSClientConfig.CAData)
	for _, name := range slices.Sorted(maps.Keys(pods)) {
		ns, closeNS, err := c.PodNetNS(ctx, WorkloadNamespace, name)
		if err != nil {
			t.Fatal(err)
		}
		defer closeNS()
		tally := ns.Spread(netlab.TCP, netip.AddrPortFrom(ip, WebPort), requests, 2*time.Second)
		t.Logf("pod %s → %s:%d %s", name, ip, WebPort, tally)
		if tally.Answered() != requests || tally.Answers[name] == 0 {
			t.Errorf("pod %s → %s:%d: %d of %d answered, %d by itself (first failure: %v)", name, ip, WebPort, tally.Answered(), requests, tally.Answers[name], tally.FirstErr)
		}
		hc := &http.Client{Transport: &http.Transport{DialContext: ns.DialContext, TLSClientConfig: &tls.Config{RootCAs: pool}, DisableKeepAlives: true}}
		resp, err := hc.Get("https://" + netip.AddrPortFrom(kubernetes, 443).String() + "/version")
		if err != nil {
			t.Errorf("pod %s → kubernetes Service %s:443: %v", name, kubernetes, err)
			continue
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"gitVersion": "v1.37.2"`) {
			t.Errorf("pod %s → kubernetes Service /version: %s %s", name, resp.Status, body)
		}
	}
}

// checkRelabel relabels one of the web pods out of its Services
// (app=removed) and checks that it leaves the EndpointSlice, every node's
// kube-proxy rules (read with iptables-save inside the node), and the
// traffic, while it still runs and answers at its own address; and that
// the replacement the ReplicaSet starts takes its place in the slice and
// the rules.
func checkRelabel(t *testing.T, c *Cluster) {
	ctx := t.Context()
	pods, err := c.WebPods(ctx)
	if err != nil {
		t.Fatal(err)
	}
	names := slices.Sorted(maps.Keys(pods))
	victim, ip := names[0], pods[names[0]]
	dnat := fmt.Sprintf("--to-destination %s:8080", ip)
	for _, n := range c.Nodes {
		if rules := natRules(t, n); !strings.Contains(rules, dnat) {
			t.Fatalf("%s: kube-proxy's rules lack %s's endpoint (%s) before the relabel:\n%s", n.Name, victim, dnat, rules)
		}
	}

	relabelled := time.Now()
	if _, err := c.Kubectl(ctx, "label", "pod", "-n", WorkloadNamespace, victim, "app=removed", "--overwrite"); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, c, "the relabelled pod leaves the web EndpointSlices", func(ctx context.Context) error {
		addrs, err := sliceAddrs(ctx, c)
		if err != nil {
			return err
		}
		if slices.Contains(addrs, ip.String()) {
			return fmt.Errorf("endpoints %v still hold %s", addrs, ip)
		}
		return nil
	})
	t.Logf("%s (%s) left the EndpointSlices %.2fs after the relabel", victim, ip, time.Since(relabelled).Seconds())
	for _, n := range c.Nodes {
		waitUntil(t, c, n.Name+"'s kube-proxy rules drop the relabelled pod", func(ctx context.Context) error {
			if strings.Contains(natRules(t, n), dnat) {
				return fmt.Errorf("iptables-save -t nat still has %s", dnat)
			}
			return nil
		})
		t.Logf("%s: no rule leads to %s any more (%.2fs after the relabel)", n.Name, ip, time.Since(relabelled).Seconds())
	}

	// The ReplicaSet replaces the pod its selector lost; once the new one
	// is ready it is in the slice and in every node's rules.
	var replacement string
	var replacementIP netip.Addr
	waitUntil(t, c, "a replacement pod ready in the EndpointSlices", func(ctx context.Context) error {
		now, err := c.WebPods(ctx)
		if err != nil {
			return err
		}
		addrs, err := sliceAddrs(ctx, c)
		if err != nil {
			return err
		}
		for name, a := range now {
			if _, old := pods[name]; !old && slices.Contains(addrs, a.String()) {
				replacement, replacementIP = name, a
				return nil
			}
		}
		return fmt.Errorf("pods %v, ready endpoints %v", slices.Sorted(maps.Keys(now)), addrs)
	})
	for _, n := range c.Nodes {
		waitUntil(t, c, n.Name+"'s kube-proxy rules take the replacement pod", func(ctx context.Context) error {
			if want := fmt.Sprintf("--to-destination %s:8080", replacementIP); !strings.Contains(natRules(t, n), want) {
				return fmt.Errorf("iptables-save -t nat lacks %s", want)
			}
			return nil
		})
	}
	t.Logf("replacement %s (%s) serves from every node", replacement, replacementIP)

	checkTraffic(t, c, victim)
	// The relabelled pod still runs: only the Services left it.
	name, err := c.Nodes[0].NS.Request(netlab.TCP, netip.AddrPortFrom(ip, 8080), 2*time.Second)
	if err != nil || name != victim {
		t.Errorf("the relabelled pod at %s:8080 answers %q, %v; want %s still serving", ip, name, err, victim)
	}
}

// readHostSysctls reads the host-wide sysctls the kubelet sets.
func readHostSysctls(t *testing.T) map[string]string {
	out := map[string]string{}
	for _, s := range kubeletSysctls {
		b, err := os.ReadFile("/proc/sys/" + s.key)
		if err != nil {
			t.Fatal(err)
		}
		out[s.key] = strings.TrimSpace(string(b))
	}
	return out
}

// natRules is the nat table of the node's iptables (nft backend, which
// kube-proxy's image uses), read inside the node.
func natRules(t *testing.T, n *Node) string {
	out, err := n.Exec(t.Context(), "iptables-nft-save", "-t", "nat")
	if err != nil {
		t.Fatalf("%s: %v", n.Name, err)
	}
	return string(out)
}

// sliceAddrs lists the ready endpoint addresses of the web Service's
// EndpointSlices.
func sliceAddrs(ctx context.Context, c *Cluster) ([]string, error) {
	slices, err := c.Kube.DiscoveryV1().EndpointSlices(WorkloadNamespace).List(ctx, metav1.ListOptions{
		LabelSelector: discoveryv1.LabelServiceName + "=" + WebService,
	})
	if err != nil {
		return nil, err
	}
	var addrs []string
	for _, s := range slices.Items {
		for _, e := range s.Endpoints {
			if e.Conditions.Ready == nil || *e.Conditions.Ready {
				addrs = append(addrs, e.Addresses...)
			}
		}
	}
	return addrs, nil
}

// waitUntil polls check for up to a minute, failing the test with its
// last error (or the log of a cluster process that exited).
func waitUntil(t *testing.T, c *Cluster, what string, check func(context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if err := controlplane.WaitFor(ctx, what, 100*time.Millisecond, c.Processes(), check); err != nil {
		t.Fatal(err)
	}
}
