package realcluster

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
)

// checkInstall does what the README tells a user of a cluster without a
// registry: `make images`, import both archives on every node, `kubectl
// apply -k config/local`. It then checks that the operator and every agent
// run Ready under their shipped security context, that every agent reports
// its ProxyNode, that their health and metrics endpoints answer where the
// manifests say, and that installing changed nothing: no node holds a rule
// of proxyshift's and kube-proxy still serves every way in.
func checkInstall(t *testing.T, c *Cluster) {
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Minute)
	defer cancel()
	timings, err := c.InstallProxyshift(ctx)
	for _, tm := range timings {
		t.Logf("timing: %s %6.2fs", tm.Step, tm.Duration.Seconds())
	}
	if err != nil {
		t.Fatal(err)
	}
	cl := proxyshiftClient(t, c)

	t.Run("every agent reports its ProxyNode", func(t *testing.T) {
		for _, n := range c.Nodes {
			waitUntil(t, c, n.Name+"'s agent reports its ProxyNode", func(ctx context.Context) error {
				pn := &v1alpha1.ProxyNode{}
				if err := cl.Get(ctx, types.NamespacedName{Name: n.Name}, pn); err != nil {
					return err
				}
				if pn.Spec.DesiredMode != "" {
					return fmt.Errorf("desiredMode %q: installing must ask nothing of a node", pn.Spec.DesiredMode)
				}
				if pn.Status.Kernel == nil || pn.Status.Phase == "" {
					return fmt.Errorf("status not reported yet: %+v", pn.Status)
				}
				return nil
			})
		}
		out, err := c.Kubectl(ctx, "get", "proxynodes", "-o", "wide")
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("kubectl get proxynodes -o wide:\n%s", out)
	})

	t.Run("health and metrics answer where the manifests say", func(t *testing.T) {
		// The agent, on each node's loopback (hostNetwork), beside
		// kube-proxy's 10249 and 10256.
		for _, n := range c.Nodes {
			for _, e := range []struct{ url, want string }{
				{"http://127.0.0.1:10266/livez", "ok"},
				{"http://127.0.0.1:10266/healthz", "ok"},
				{"http://127.0.0.1:10265/metrics", "proxyshift_"},
				{"http://127.0.0.1:10249/proxyMode", "iptables"},
			} {
				code, body, err := n.NS.HTTPGet(ctx, e.url)
				if err != nil || code != 200 || !strings.Contains(body, e.want) {
					t.Errorf("%s: GET %s: %d %v, want 200 with %q; body:\n%.300s", n.Name, e.url, code, err, e.want, body)
				}
			}
		}
		// The operator, on its pod's address.
		ip, err := c.Kubectl(ctx, "-n", "proxyshift-system", "get", "pods", "-l", "app.kubernetes.io/component=operator",
			"-o", "jsonpath={.items[0].status.podIP}")
		if err != nil || ip == "" {
			t.Fatalf("operator pod IP: %q %v", ip, err)
		}
		for _, path := range []string{"/healthz", "/readyz"} {
			url := "http://" + ip + ":8081" + path
			code, body, err := c.Nodes[0].NS.HTTPGet(ctx, url)
			if err != nil || code != 200 || !strings.Contains(body, "ok") {
				t.Errorf("operator: GET %s: %d %v, want 200 ok; body:\n%.300s", url, code, err, body)
			}
		}
		// Metrics over HTTPS behind the API server's authentication: a
		// request without a token is refused (test/apiserver shows 403
		// and 200 with tokens).
		hc := &http.Client{Transport: &http.Transport{
			DialContext:     c.Nodes[0].NS.DialContext,
			TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, // the operator's self-signed serving cert
		}}
		resp, err := hc.Get("https://" + ip + ":8443/metrics")
		if err != nil {
			t.Fatalf("operator metrics: %v", err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("operator: GET https://%s:8443/metrics without a token: %s, want 401", ip, resp.Status)
		}
	})

	t.Run("each process has only the privileges its manifest grants", func(t *testing.T) { checkPrivileges(t, c) })
	t.Run("an agent's pod-bound token writes only its own node's status", func(t *testing.T) { checkNodeScopedWrites(t, c) })

	t.Run("installing changed nothing", func(t *testing.T) {
		for _, n := range c.Nodes {
			for _, dump := range [][]string{{"nft", "list", "ruleset"}, {"iptables-nft-save"}, {"iptables-legacy-save"}} {
				out, err := n.Exec(ctx, dump[0], dump[1:]...)
				if err != nil {
					t.Fatalf("%s: %s: %v", n.Name, strings.Join(dump, " "), err)
				}
				// proxyshift's own objects: its PROXYSHIFT-* chains and its
				// proxyshift tables. kube-proxy's rules for the Services in
				// proxyshift-system (the operator's metrics) name the
				// namespace in comments; they are kube-proxy's.
				if proxyshiftObjects.Match(out) {
					t.Errorf("%s: %s shows proxyshift's objects after installing:\n%s", n.Name, strings.Join(dump, " "), out)
				}
			}
		}
		checkTraffic(t, c, "")
	})
}

// proxyshiftObjects matches what proxyshift programs in iptables-save and
// nft list ruleset output.
var proxyshiftObjects = regexp.MustCompile(`PROXYSHIFT-|table (ip|ip6|inet) proxyshift\b`)

// proxyshiftClient is c.ProxyshiftClient, failing the test on error.
func proxyshiftClient(t *testing.T, c *Cluster) client.Client {
	t.Helper()
	cl, err := c.ProxyshiftClient()
	if err != nil {
		t.Fatal(err)
	}
	return cl
}
