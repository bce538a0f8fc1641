package netlab

import (
	"context"
	"io"
	"net"
	"sync"
	"time"
)

// Forwarder relays the TCP connections a listener accepts to a fixed
// address reached through dial. Listener and dialer may live in different
// network namespaces (see NetNS.Listen and NetNS.DialContext), which
// joins two of them for one TCP service without any interface or route
// between them: kubectl in the root namespace reaches an API server inside
// a lab, or a program inside a lab reaches an API server on the root
// namespace's loopback.
type Forwarder struct {
	l      net.Listener
	target string
	dial   DialFunc

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// DialFunc opens a connection, like net.Dialer's DialContext.
type DialFunc func(ctx context.Context, network, addr string) (net.Conn, error)

// Forward relays every connection l accepts to target, dialled with dial,
// until Close (which also closes l).
func Forward(l net.Listener, target string, dial DialFunc) *Forwarder {
	f := &Forwarder{l: l, target: target, dial: dial, conns: map[net.Conn]struct{}{}}
	f.wg.Add(1)
	go f.serve()
	return f
}

// Listen opens a listener inside ns (only the socket's creation happens
// there; it can be served from any goroutine).
func (ns *NetNS) Listen(network, address string) (net.Listener, error) {
	var l net.Listener
	err := ns.Do(func() error {
		var err error
		l, err = net.Listen(network, address)
		return err
	})
	return l, err
}

// Addr is the listening address ("127.0.0.1:port").
func (f *Forwarder) Addr() string { return f.l.Addr().String() }

func (f *Forwarder) serve() {
	defer f.wg.Done()
	for {
		c, err := f.l.Accept()
		if err != nil {
			return // closed
		}
		if !f.track(c) {
			_ = c.Close()
			return
		}
		f.wg.Add(1)
		go f.relay(c)
	}
}

func (f *Forwarder) track(c net.Conn) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return false
	}
	f.conns[c] = struct{}{}
	return true
}

func (f *Forwarder) untrack(c net.Conn) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.conns, c)
}

func (f *Forwarder) relay(c net.Conn) {
	defer f.wg.Done()
	defer f.untrack(c)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	up, err := f.dial(ctx, "tcp4", f.target)
	cancel()
	if err != nil {
		return
	}
	if !f.track(up) {
		_ = up.Close()
		return
	}
	defer f.untrack(up)
	defer up.Close()
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		// Half-close so the other direction can finish, as TCP would.
		if tc, ok := dst.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		}
		done <- struct{}{}
	}
	go pipe(up, c)
	go pipe(c, up)
	<-done
	<-done
}

// Close stops accepting, closes every relayed connection and waits for
// the relays to end.
func (f *Forwarder) Close() {
	f.mu.Lock()
	if !f.closed {
		f.closed = true
		_ = f.l.Close()
		for c := range f.conns {
			_ = c.Close()
		}
	}
	f.mu.Unlock()
	f.wg.Wait()
}
