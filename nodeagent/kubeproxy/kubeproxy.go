// Package kubeproxy is what the agent knows of kube-proxy on its node: in
// which mode kube-proxy's objects sit in the kernel, whether a running
// kube-proxy has synced them, and how to remove them once kube-proxy has
// left the node.
//
// A node is taken over from kube-proxy and handed back to it while
// kube-proxy's pod comes and goes (the operator moves it with a node
// label). The agent never asks the API server about pods: the kernel says
// whether kube-proxy's rules are there, and kube-proxy's own metrics
// endpoint on the node says whether the kube-proxy that runs has finished
// a sync (kubeproxy_sync_proxy_rules_last_timestamp_seconds is set at the
// end of each successful sync, the first of which programs every Service).
// Whether the pod has left is the operator's word (ProxyNode
// spec.kubeProxyStopped), not this package's.
package kubeproxy

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
	"github.com/proxyshift/proxyshift/nodeagent/cleanup"
	"github.com/proxyshift/proxyshift/nodeagent/nsexec"
)

// DefaultMetricsURL is where kube-proxy serves its metrics when its
// configuration leaves metricsBindAddress at the default (127.0.0.1:10249).
const DefaultMetricsURL = "http://127.0.0.1:10249/metrics"

// syncedMetric is set by kube-proxy at the end of each successful sync.
const syncedMetric = "kubeproxy_sync_proxy_rules_last_timestamp_seconds"

// The names by which the kernel shows kube-proxy's other modes: its
// nftables mode's table (ip and ip6), and the chain every Service of its
// iptables mode hangs off (nat table; its IPVS mode has it too, hence the
// order in Mode).
const (
	nftTable      = "kube-proxy"
	iptablesChain = "KUBE-SERVICES"
)

// Node looks at kube-proxy on one node.
type Node struct {
	// NS is the node's network namespace (zero: the agent's own).
	NS nsexec.NS
	// MetricsURL is kube-proxy's metrics endpoint, reached from inside
	// NS; empty skips the check (Serving then trusts the kernel alone).
	MetricsURL string
}

// Mode says in which mode kube-proxy's objects are in the kernel:
// ipvs when its dummy interface exists, else nftables when its table
// does, else iptables when its KUBE-SERVICES chain is in either iptables
// backend; "" when none is. It reads a few small objects, never a whole
// ruleset, so it is cheap enough to call often.
func (n *Node) Mode(ctx context.Context) (v1alpha1.ProxyMode, error) {
	h := &netlink.Handle{}
	if nh, ok := n.NS.Handle(); ok {
		var err error
		if h, err = netlink.NewHandleAt(nh, unix.NETLINK_ROUTE); err != nil {
			return "", err
		}
		defer h.Close()
	}
	if _, err := h.LinkByName(cleanup.KubeProxyIPVSLink); err == nil {
		return v1alpha1.ModeIPVS, nil
	} else if !errors.As(err, new(netlink.LinkNotFoundError)) {
		return "", fmt.Errorf("look for %s: %w", cleanup.KubeProxyIPVSLink, err)
	}
	c, err := nftables.New(nftables.WithNetNSFd(n.NS.FD()))
	if err != nil {
		return "", fmt.Errorf("nftables: %w", err)
	}
	tables, err := c.ListTables()
	if err != nil {
		return "", fmt.Errorf("list nftables tables: %w", err)
	}
	for _, t := range tables {
		if t.Name == nftTable && (t.Family == nftables.TableFamilyIPv4 || t.Family == nftables.TableFamilyIPv6) {
			return v1alpha1.ModeNFTables, nil
		}
	}
	for _, backend := range []string{"nft", "legacy"} {
		// -S CHAIN 1 prints at most one rule, and fails when the chain
		// does not exist.
		_, err := n.NS.Output(ctx, nil, "iptables-"+backend, "-w", "5", "-t", "nat", "-S", iptablesChain, "1")
		var ee *exec.ExitError
		switch {
		case err == nil:
			return v1alpha1.ModeIPTables, nil
		case errors.Is(err, exec.ErrNotFound), errors.As(err, &ee) && ee.ExitCode() == 1:
			// No such tool, or no such chain.
		default:
			return "", fmt.Errorf("look for %s in iptables-%s: %w", iptablesChain, backend, err)
		}
	}
	return "", nil
}

// Serving says whether kube-proxy serves the node: its objects are in
// the kernel and, when MetricsURL is set, the kube-proxy that runs there
// has finished a sync. The error says what is still missing.
func (n *Node) Serving(ctx context.Context) error {
	mode, err := n.Mode(ctx)
	if err != nil {
		return err
	}
	if mode == "" {
		return errors.New("kube-proxy's rules are not in the kernel yet")
	}
	if n.MetricsURL == "" {
		return nil
	}
	ts, err := n.lastSync(ctx)
	if err != nil {
		return fmt.Errorf("kube-proxy's %s rules are in the kernel, but its metrics do not say it synced: %w", mode, err)
	}
	if ts <= 0 {
		return fmt.Errorf("kube-proxy's %s rules are in the kernel, but it has not finished a sync yet (%s is %g)", mode, syncedMetric, ts)
	}
	return nil
}

// lastSync reads kube-proxy's last successful sync time from its metrics.
func (n *Node) lastSync(ctx context.Context) (float64, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	client := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			var c net.Conn
			err := n.NS.Do(func() error {
				var err error
				c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
				return err
			})
			return c, err
		},
		DisableKeepAlives: true,
	}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, n.MetricsURL, nil)
	if err != nil {
		return 0, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("GET %s: %s", n.MetricsURL, resp.Status)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return 0, err
	}
	return metricValue(body, syncedMetric)
}

// metricValue reads the samples of name in Prometheus text exposition
// and returns the least of them: kube-proxy labels its sync metrics with
// ip_family (one sample per family it proxies), and has finished a sync
// only when every family has.
func metricValue(body []byte, name string) (float64, error) {
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	found := false
	least := 0.0
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), name)
		if !ok {
			continue
		}
		if strings.HasPrefix(rest, "{") {
			end := strings.Index(rest, "}")
			if end < 0 {
				continue
			}
			rest = rest[end+1:]
		}
		if !strings.HasPrefix(rest, " ") {
			continue // another metric whose name starts with name
		}
		fields := strings.Fields(rest)
		v, err := strconv.ParseFloat(fields[0], 64)
		if err != nil {
			return 0, fmt.Errorf("%s: %w", name, err)
		}
		if !found || v < least {
			least = v
		}
		found = true
	}
	if !found {
		return 0, fmt.Errorf("no %s sample", name)
	}
	return least, nil
}

// Cleanup removes kube-proxy's leftovers (cleanup.KubeProxy: its chains in
// both iptables backends, its nftables tables, kube-ipvs0 and its IPVS
// services, its ipsets) and describes each. Call it only once kube-proxy
// has left the node: a running kube-proxy would program them again.
func (n *Node) Cleanup(ctx context.Context) ([]string, error) {
	return (&cleanup.Sweeper{NS: n.NS}).Remove(ctx, cleanup.KubeProxy)
}
