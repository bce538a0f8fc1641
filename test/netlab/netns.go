// Package netlab builds throwaway network labs for tests: network
// namespaces, veth pairs, bridges and small servers, all inside namespaces
// the test creates and removes again, with addresses from 198.18.0.0/15
// and, the labs being dual-stack, their IPv6 twins in 2001:db8::/32 (see
// IPv6Of). Nothing here touches the root namespace's interfaces, routes,
// sysctls or netfilter rules.
package netlab

import (
	"fmt"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/vishvananda/netns"

	"github.com/proxyshift/proxyshift/nodeagent/nsexec"
)

// NetNS is a network namespace created for one test.
type NetNS struct {
	// Name is the namespace's name under /run/netns (usable with `ip netns exec`).
	Name   string
	Handle netns.NsHandle
}

var nsCounter atomic.Int64

// nsPrefix starts the name of every namespace NewNetNS creates; the pid
// after it lets a later test process remove what a killed one left
// (SweepStale), once, before it creates its first (sweptStale).
const nsPrefix = "ps-"

var sweptStale sync.Once

// RequireRoot skips the test, naming what is missing, unless it runs as
// root (network namespaces need CAP_SYS_ADMIN and CAP_NET_ADMIN).
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces (run as root, e.g. `sudo make test`)")
	}
}

// NewNetNS creates a named network namespace ("ps-<pid>-<n>-<role>") with
// its loopback up, and removes it when the test ends. A test process
// killed before its cleanups ran leaves its namespaces behind: the first
// NewNetNS of the next test process removes them.
func NewNetNS(t testing.TB, role string) *NetNS {
	t.Helper()
	RequireRoot(t)
	sweptStale.Do(func() { SweepStale(nsPrefix, t.Logf) })
	name := OwnedName(nsPrefix, fmt.Sprintf("%d-%s", nsCounter.Add(1), role))
	var h netns.NsHandle
	err := onLockedThread(func() error {
		orig, err := netns.Get()
		if err != nil {
			return err
		}
		defer orig.Close()
		defer netns.Set(orig) //nolint:errcheck // restoring the thread's namespace; failure is fatal below
		h, err = netns.NewNamed(name)
		return err
	})
	if err != nil {
		t.Fatalf("create network namespace %s: %v", name, err)
	}
	ns := &NetNS{Name: name, Handle: h}
	t.Cleanup(func() {
		_ = h.Close()
		if err := netns.DeleteNamed(name); err != nil {
			t.Errorf("delete network namespace %s: %v", name, err)
		}
	})
	if err := ns.Do(bringLoopbackUp); err != nil {
		t.Fatalf("loopback up in %s: %v", name, err)
	}
	return ns
}

// FD is the namespace's file descriptor, for netlink clients that take one.
func (ns *NetNS) FD() int { return int(ns.Handle) }

// NS is the namespace as the agent's packages take one.
func (ns *NetNS) NS() nsexec.NS { return nsexec.NS(ns.Handle) }

// Do runs fn on an OS thread switched into the namespace. Sockets fn opens
// stay in the namespace after fn returns.
func (ns *NetNS) Do(fn func() error) error { return ns.NS().Do(fn) }

// onLockedThread runs fn on a locked OS thread. If fn leaves the thread
// locked (because restoring its namespace failed), the goroutine exits with
// it locked and the runtime throws the thread away.
func onLockedThread(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		errc <- fn()
	}()
	return <-errc
}
