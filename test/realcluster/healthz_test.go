package realcluster

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
)

// requireKubeProxyHealthz waits until port 10256 answers /healthz and
// /livez with 200 on every node's address, from the one that should
// answer there: the proxyshift agent on nodes it took over (agent true),
// kube-proxy on nodes it serves. The two answer in the same shape, but
// kube-proxy's answer carries its per-family "status" and the agent's
// does not (docs/api.md). kube-proxy answering after a hand-back shows
// the agent released the port.
func requireKubeProxyHealthz(t *testing.T, c *Cluster, agent bool) {
	t.Helper()
	who := "kube-proxy"
	if agent {
		who = "the proxyshift agent"
	}
	var seen string
	for _, n := range c.Nodes {
		waitUntil(t, c, fmt.Sprintf("%s answering on %s:10256", who, n.Name), func(ctx context.Context) error {
			for _, path := range []string{"/healthz", "/livez"} {
				url := fmt.Sprintf("http://%s:10256%s", n.IP, path)
				code, body, err := n.NS.HTTPGet(ctx, url)
				if err != nil {
					return err
				}
				var answer map[string]any
				if err := json.Unmarshal([]byte(body), &answer); err != nil || code != http.StatusOK {
					return fmt.Errorf("GET %s: %d %q", url, code, body)
				}
				if _, kubeProxy := answer["status"]; kubeProxy == agent {
					return fmt.Errorf("GET %s answered %q: not %s", url, body, who)
				}
				seen = fmt.Sprintf("%s: GET %s: %s", n.Name, url, body)
			}
			return nil
		})
	}
	t.Logf("%s answers on port 10256 of every node, e.g. %s", who, seen)
}
