package bench

import (
	"context"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/proxyshift/proxyshift/test/netlab"
)

// TestLabAnswersAsEveryEndpoint checks the lab the benchmark rests on:
// from a node namespace, any address of EndpointCIDR answers with itself,
// the API relays (on the node's loopback, and on the address the API
// server advertises) reach a server on the root namespace's loopback, and
// closing removes both namespaces.
func TestLabAnswersAsEveryEndpoint(t *testing.T) {
	netlab.RequireRoot(t)
	api, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer api.Close()
	go func() {
		for {
			c, err := api.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte("api\n"))
			_ = c.Close()
		}
	}()
	lab, err := NewLab()
	if err != nil {
		t.Fatal(err)
	}
	node, err := lab.NewNode(api.Addr().String())
	if err != nil {
		_ = lab.Close()
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, ep := range []netip.Addr{EndpointCIDR.Addr().Next(), fixedPool.Addr(), freshPool.Addr().Next(), nthAddr(freshPool.Addr(), 1000)} {
		got, connect, err := node.Ask(ctx, netip.AddrPortFrom(ep, EndpointPort), 2*time.Second)
		if err != nil || got != ep {
			t.Errorf("ask %s: answered as %s, %v", ep, got, err)
		}
		if connect <= 0 {
			t.Errorf("ask %s: connect time %s", ep, connect)
		}
	}
	if !EndpointCIDR.Contains(freshPool.Addr()) || fixedPool.Contains(freshPool.Addr()) {
		t.Errorf("pools overlap or leave EndpointCIDR: fixed %s fresh %s", fixedPool, freshPool)
	}
	_, port, _ := net.SplitHostPort(api.Addr().String())
	for _, addr := range []string{node.APIServer, net.JoinHostPort(APIAdvertiseIP.String(), port)} {
		c, err := node.NS.DialContext(ctx, "tcp4", addr)
		if err != nil {
			t.Fatalf("relay %s: %v", addr, err)
		}
		buf := make([]byte, 4)
		if _, err := c.Read(buf); err != nil || string(buf) != "api\n" {
			t.Errorf("relay %s answered %q, %v", addr, buf, err)
		}
		_ = c.Close()
	}
	names := []string{node.NS.Name, lab.Backends.Name}
	if err := node.Close(); err != nil {
		t.Error(err)
	}
	if err := lab.Close(); err != nil {
		t.Error(err)
	}
	entries, _ := os.ReadDir("/run/netns")
	for _, e := range entries {
		for _, n := range names {
			if e.Name() == n {
				t.Errorf("namespace %s left behind", n)
			}
		}
		if strings.HasPrefix(e.Name(), netlab.OwnedName(nsPrefix, "")) {
			t.Errorf("namespace %s of this process left behind", e.Name())
		}
	}
}
