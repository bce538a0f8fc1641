// Package probe checks from the node itself that services answer: it
// opens TCP connections, inside the node's network namespace, to a sample
// of the model's cluster IPs and NodePorts, as the Verifying phase of a
// switch does before the old mode is removed.
//
// A probe only proves that some rules carried the connection to an
// endpoint. Which backend did depends on netfilter hook order (see
// docs/switching.md): the switcher probes once before it programs the new
// mode (a baseline of what the old mode serves) and requires the same
// targets to answer afterwards.
package probe

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/proxyshift/proxyshift/internal/text"
	"github.com/proxyshift/proxyshift/nodeagent/model"
	"github.com/proxyshift/proxyshift/nodeagent/nsexec"
)

// Target is one address to probe.
type Target struct {
	// Name says what the address is, e.g. "default/web:http/TCP cluster IP".
	Name string
	Addr netip.AddrPort
	// Endpoints are the endpoints (address, port and conditions) the
	// service port had when the target was listed: a target whose
	// endpoints changed since may rightly answer differently.
	Endpoints string
}

func (t Target) String() string { return t.Name + " " + t.Addr.String() }

// Targets picks up to max cluster IPs and up to maxNodePorts NodePorts of
// TCP service ports that have endpoints, spread evenly over the ports
// sorted by name (so the same model gives the same sample). NodePorts are
// probed on the first of nodeIPs of their family. Only families with an
// address in nodeIPs are probed (IPv4 when nodeIPs is empty).
func Targets(snap *model.Snapshot, nodeIPs []netip.Addr, max, maxNodePorts int) []Target {
	if snap == nil {
		return nil
	}
	fams := map[corev1.IPFamily]netip.Addr{}
	for _, ip := range nodeIPs {
		f := corev1.IPv4Protocol
		if ip.Is6() && !ip.Is4In6() {
			f = corev1.IPv6Protocol
		}
		if _, ok := fams[f]; !ok {
			fams[f] = ip.Unmap()
		}
	}
	if len(fams) == 0 {
		fams[corev1.IPv4Protocol] = netip.Addr{}
	}
	// The candidates are kept as what a Target is made of: the text of
	// the endpoints, the costly part at 10 000 ports (fmt.Sprint of each
	// port's endpoints), is written for the picked ones only.
	var cluster, nodePorts []candidate
	for _, fam := range []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol} {
		nodeIP, ok := fams[fam]
		if !ok {
			continue
		}
		ports := make([]candidate, 0, len(snap.Ports[fam]))
		for n, sp := range snap.Ports[fam] {
			ports = append(ports, candidate{name: n.String(), sp: sp})
		}
		slices.SortFunc(ports, func(a, b candidate) int { return strings.Compare(a.name, b.name) })
		for _, c := range ports {
			sp := c.sp
			if sp.Protocol != corev1.ProtocolTCP || len(sp.ClusterEndpoints()) == 0 {
				continue
			}
			if sp.ClusterIP.IsValid() && len(sp.InternalEndpoints()) > 0 {
				cluster = append(cluster, candidate{name: c.name + " cluster IP", sp: sp, addr: netip.AddrPortFrom(sp.ClusterIP, uint16(sp.Port))})
			}
			if sp.NodePort != 0 && nodeIP.IsValid() {
				nodePorts = append(nodePorts, candidate{name: c.name + " NodePort", sp: sp, addr: netip.AddrPortFrom(nodeIP, uint16(sp.NodePort))})
			}
		}
	}
	var out []Target
	for _, c := range append(spread(cluster, max), spread(nodePorts, maxNodePorts)...) {
		out = append(out, Target{Name: c.name, Addr: c.addr, Endpoints: fmt.Sprint(c.sp.Endpoints)})
	}
	return out
}

// candidate is a target Targets may pick: its name, address and port.
type candidate struct {
	name string
	sp   *model.ServicePort
	addr netip.AddrPort
}

// spread picks up to n of ts, evenly spaced.
func spread[T any](ts []T, n int) []T {
	if n <= 0 {
		return nil
	}
	if len(ts) <= n {
		return ts
	}
	out := make([]T, 0, n)
	for i := range n {
		out = append(out, ts[i*len(ts)/n])
	}
	return out
}

// Prober opens the connections.
type Prober struct {
	// NS is the node's network namespace.
	NS nsexec.NS
	// Timeout bounds one connection attempt (default 1s).
	Timeout time.Duration
	// Attempts is how often a target is tried before it counts as not
	// answering (default 3).
	Attempts int
}

// Result is one target's outcome; Err is nil when it answered.
type Result struct {
	Target Target
	Err    error
}

// Probe tries every target, all at once, and returns the outcomes in
// the targets' order.
func (p *Prober) Probe(ctx context.Context, targets []Target) []Result {
	timeout, attempts := p.Timeout, p.Attempts
	if timeout <= 0 {
		timeout = time.Second
	}
	if attempts <= 0 {
		attempts = 3
	}
	out := make([]Result, len(targets))
	var wg sync.WaitGroup
	for i, t := range targets {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var err error
			for a := 0; a < attempts; a++ {
				if err = ctx.Err(); err != nil {
					break
				}
				if err = p.dial(ctx, t.Addr, timeout); err == nil {
					break
				}
				if a+1 < attempts {
					time.Sleep(100 * time.Millisecond)
				}
			}
			out[i] = Result{Target: t, Err: err}
		}()
	}
	wg.Wait()
	return out
}

// Answered returns the targets of results that answered.
func Answered(results []Result) []Target {
	var out []Target
	for _, r := range results {
		if r.Err == nil {
			out = append(out, r.Target)
		}
	}
	return out
}

// Failures describes the results that did not answer, or "" if all did:
// how many, and the first few (a node probes every Service, and the text
// ends up in a status message).
func Failures(results []Result) string {
	var msgs []string
	for _, r := range results {
		if r.Err != nil {
			msgs = append(msgs, fmt.Sprintf("%s: %v", r.Target, r.Err))
		}
	}
	if len(msgs) == 0 {
		return ""
	}
	return fmt.Sprintf("%d of %d did not answer: %s", len(msgs), len(results), text.List(msgs, "; ", 5))
}

// dial opens and closes one TCP connection from inside the namespace.
func (p *Prober) dial(ctx context.Context, addr netip.AddrPort, timeout time.Duration) error {
	var c net.Conn
	err := p.NS.Do(func() error {
		d := net.Dialer{Timeout: timeout}
		var err error
		c, err = d.DialContext(ctx, "tcp", addr.String())
		return err
	})
	if err != nil {
		return err
	}
	return c.Close()
}
