package cluster

import (
	"context"
	"io"
	"net"
	"sync"
	"time"
)

// forwarder relays TCP connections accepted on a root-namespace loopback
// address to a fixed address reached through dial (a dialer opening its
// sockets inside a lab namespace). It lets kubectl in another terminal
// reach the API server, which only listens inside the control-plane
// namespace, without any interface or route in the root namespace.
type forwarder struct {
	l      net.Listener
	target string
	dial   func(ctx context.Context, network, addr string) (net.Conn, error)

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// startForwarder listens on listenAddr, which must be a loopback address.
func startForwarder(listenAddr, target string, dial func(ctx context.Context, network, addr string) (net.Conn, error)) (*forwarder, error) {
	l, err := net.Listen("tcp4", listenAddr)
	if err != nil {
		return nil, err
	}
	f := &forwarder{l: l, target: target, dial: dial, conns: map[net.Conn]struct{}{}}
	f.wg.Add(1)
	go f.serve()
	return f, nil
}

// Addr is the listening address ("127.0.0.1:port").
func (f *forwarder) Addr() string { return f.l.Addr().String() }

func (f *forwarder) serve() {
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

func (f *forwarder) track(c net.Conn) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return false
	}
	f.conns[c] = struct{}{}
	return true
}

func (f *forwarder) untrack(c net.Conn) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.conns, c)
}

func (f *forwarder) relay(c net.Conn) {
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
func (f *forwarder) Close() {
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
