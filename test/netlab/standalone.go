package netlab

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"runtime"

	"github.com/vishvananda/netns"
)

// This file serves programs that build labs outside a test (the local
// cluster harness, the demo, benchmarks): they create namespaces with
// CreateNetNS and remove them with Delete themselves, since there is no
// testing.TB to hang the cleanup on.

// CreateNetNS creates a network namespace called name (under /run/netns,
// usable with `ip netns exec`) with its loopback up, IPv6 off and
// reverse-path filtering off (see IPv4Only). The caller removes it with
// Delete. It fails if the name is taken.
func CreateNetNS(name string) (*NetNS, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("creating network namespaces needs root")
	}
	var h netns.NsHandle
	err := onLockedThread(func() error {
		orig, err := netns.Get()
		if err != nil {
			return err
		}
		defer orig.Close()
		h, err = netns.NewNamed(name)
		if setErr := netns.Set(orig); setErr != nil {
			// Stuck in the new namespace: leave the thread locked so the
			// runtime discards it.
			if err == nil {
				_ = h.Close()
				_ = netns.DeleteNamed(name)
			}
			return fmt.Errorf("return to the original namespace: %w", setErr)
		}
		runtime.UnlockOSThread()
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("create network namespace %s: %w", name, err)
	}
	ns := &NetNS{Name: name, Handle: h}
	if err := ns.Do(bringLoopbackUp); err != nil {
		_ = ns.Delete()
		return nil, fmt.Errorf("loopback up in %s: %w", name, err)
	}
	if err := ns.ipv4Only(); err != nil {
		_ = ns.Delete()
		return nil, err
	}
	return ns, nil
}

// Delete closes the namespace's handle and removes its name. The kernel
// frees the namespace, with its links and netfilter state, once no
// process and no socket is left in it.
func (ns *NetNS) Delete() error {
	_ = ns.Handle.Close()
	if err := netns.DeleteNamed(ns.Name); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("delete network namespace %s: %w", ns.Name, err)
	}
	return nil
}

// IPv4Only turns IPv6 and reverse-path filtering off in ns (NewNetNS
// leaves that to the lab builders; CreateNetNS does it already).
func (ns *NetNS) IPv4Only() error { return ns.ipv4Only() }

// DialContext opens a connection from inside ns, like net.Dialer's
// DialContext: only the socket's creation happens in the namespace, the
// connection can be used from any goroutine. It fits rest.Config.Dial and
// http.Transport.DialContext, so a process in the root namespace can talk
// to servers inside a lab without any interface in the root namespace.
// Addresses must be IP literals (no resolver runs in the namespace).
func (ns *NetNS) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	var c net.Conn
	err := ns.Do(func() error {
		var err error
		c, err = (&net.Dialer{}).DialContext(ctx, network, address)
		return err
	})
	return c, err
}

// HTTPGet fetches url (an IP literal host) with a connection opened inside
// ns, without keep-alive, and returns the status code and up to 1 MiB of
// the body.
func (ns *NetNS) HTTPGet(ctx context.Context, url string) (int, string, error) {
	hc := &http.Client{Transport: &http.Transport{DialContext: ns.DialContext, DisableKeepAlives: true}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, "", err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, string(b), err
}
