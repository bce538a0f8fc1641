// Package outage_test runs the agent binary through API server outages, in
// the namespace-lab cluster (test/cluster): an agent that serves when the
// API server goes away for a minute, and an agent that starts while it is
// away, with rules already programmed by the agent before it. In both,
// traffic through the node must not fail once, the agent must never exit,
// and syncing must resume when the API server is back.
package outage_test

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/proxyshift/proxyshift/test/cluster"
	"github.com/proxyshift/proxyshift/test/netlab"
)

// outage is how long the API server stays away.
const outage = 60 * time.Second

func TestAgentSurvivesAPIServerOutages(t *testing.T) {
	netlab.RequireRoot(t)
	ctx := t.Context()
	c, err := cluster.Start(ctx, cluster.Options{Nodes: 2, NoOperator: true, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	node := c.Node("node-1")
	web, np := c.Service(cluster.ServiceWeb), c.Service(cluster.ServiceNodePort)
	client := c.ClientHost() // its traffic enters the cluster at node-1
	targets := []netip.AddrPort{web.ClusterAddr(), np.NodePortAddr(node)}

	t.Run("stopped for a minute under traffic", func(t *testing.T) {
		loop := netlab.StartClientLoop(t, client.NS, targets...)
		if err := c.APIServer.Stop(10 * time.Second); err != nil {
			t.Fatal(err)
		}
		watchAgent(t, node, outage, http.StatusOK)
		restartAPIServer(t, c)
		syncResumes(t, c, client, web)
		loop.RequireNoFailures(t, "traffic through node-1 while the API server was away and after it came back")
	})

	t.Run("agent started while it is away", func(t *testing.T) {
		loop := netlab.StartClientLoop(t, client.NS, targets...)
		if err := c.APIServer.Stop(10 * time.Second); err != nil {
			t.Fatal(err)
		}
		// kill -9 leaves the rules in the kernel, as a crash would.
		if err := node.Agent.Kill(); err != nil {
			t.Fatal(err)
		}
		started := time.Now()
		if err := node.Agent.Start(); err != nil {
			t.Fatal(err)
		}
		for {
			rctx, cancel := context.WithTimeout(ctx, time.Second)
			code, _, err := node.HTTPGet(rctx, node.HealthzAddr, "/livez")
			cancel()
			if err == nil && code == http.StatusOK {
				t.Logf("/livez answered %v after the agent started", time.Since(started).Round(time.Millisecond))
				break
			}
			if time.Since(started) > time.Second {
				t.Fatalf("/livez did not answer within 1s of the agent's start: %d %v", code, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
		// It has not listed anything: not healthy, but alive and serving.
		watchAgent(t, node, outage, http.StatusServiceUnavailable)
		restartAPIServer(t, c)
		if err := c.WaitAgentHealthy(ctx, node, 2*time.Minute); err != nil {
			t.Fatal(err)
		}
		syncResumes(t, c, client, web)
		loop.RequireNoFailures(t, "traffic through node-1 while its agent started without the API server, and after")
	})
}

// watchAgent checks every 5 seconds for d that the node's agent runs,
// answers /livez, and answers /healthz with healthz.
func watchAgent(t *testing.T, n *cluster.Node, d time.Duration, healthz int) {
	t.Helper()
	exited, exitErr := n.Agent.Exited()
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		select {
		case <-exited:
			t.Fatalf("the agent exited while the API server was away: %v", exitErr())
		case <-time.After(5 * time.Second):
		}
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		live, _, err := n.HTTPGet(ctx, n.HealthzAddr, "/livez")
		health, body, err2 := n.HTTPGet(ctx, n.HealthzAddr, "/healthz")
		cancel()
		if err != nil || live != http.StatusOK {
			t.Errorf("/livez while the API server is away: %d %v", live, err)
		}
		if err2 != nil || health != healthz {
			t.Errorf("/healthz while the API server is away: %d %q %v; want %d", health, strings.TrimSpace(body), err2, healthz)
		}
	}
}

// restartAPIServer starts the API server again and waits until it is
// ready.
func restartAPIServer(t *testing.T, c *cluster.Cluster) {
	t.Helper()
	if err := c.APIServer.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		_, err := c.Kube.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the API server is not ready 2 minutes after its restart: %v", err)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// syncResumes moves the Service's endpoints to node-2's pods, checks that
// traffic entering at node-1 follows, and moves them back to every pod:
// the agent syncs again. After a long outage client-go's informers retry
// their list on a backoff that reaches 30 seconds with up to 100% jitter,
// so the first change may take a minute or more to arrive.
func syncResumes(t *testing.T, c *cluster.Cluster, client *cluster.Host, svc *cluster.Service) {
	t.Helper()
	var far []*cluster.Pod
	for _, p := range c.Pods {
		if p.Node.Name == "node-2" {
			far = append(far, p)
		}
	}
	for _, pods := range [][]*cluster.Pod{far, c.Pods} {
		if err := c.SetEndpoints(t.Context(), svc, pods); err != nil {
			t.Fatal(err)
		}
		var want []string
		for _, p := range pods {
			want = append(want, p.Name)
		}
		slices.Sort(want)
		start := time.Now()
		deadline := start.Add(150 * time.Second)
		for {
			tally := client.NS.Spread(netlab.TCP, svc.ClusterAddr(), 40, 2*time.Second)
			if tally.Answered() == 40 && slices.Equal(tally.Names(), want) {
				t.Logf("endpoints %v synced %v after the change", want, time.Since(start).Round(100*time.Millisecond))
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s answered by %v, not by exactly %s: the agent did not sync the endpoint change", svc.ClusterAddr(), tally, fmt.Sprint(want))
			}
			time.Sleep(500 * time.Millisecond)
		}
	}
}
