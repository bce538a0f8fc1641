package nft

import (
	"fmt"
	"sync"
	"time"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/proxyshift/proxyshift/nodeagent/nsexec"
)

// Netlink sockets to nf_tables are kept open between uses, one idle
// socket per network namespace, and closed after idleClose without use.
//
// Why: when a netfilter netlink socket is released, nf_tables first
// finishes the cleanup of the transactions committed before
// (nft_rcv_nl_event flushes its destroy work, which waits for an RCU
// grace period: 3 to 21 ms here), holding the commit mutex. A socket
// opened and closed for each transaction, and for the generation read
// after it, waited for that at every sync, after the commit was already
// in place: an endpoint change's sync took about 14 ms where the kernel
// needed 1, at 1 000 services as at 10 000. Kept open, the socket is not
// released while the cleanup is pending; it runs in the background. A
// socket idle for idleClose is closed when that cleanup has long run.
//
// A socket whose use failed is closed, not kept: it may hold answers
// nobody read. Every socket kept has been widened for dumps (widen).

// idleClose is how long a socket is kept without use.
const idleClose = 5 * time.Second

// netnsID names a network namespace by its inode, which no other
// namespace has while this one exists (a kept socket keeps it alive).
type netnsID struct{ dev, ino uint64 }

type keptSocket struct {
	c    *netlink.Conn
	used time.Time
}

// kept holds the idle sockets, and sweep's timer while any is kept.
var kept = struct {
	sync.Mutex
	idle  map[netnsID]keptSocket
	sweep *time.Timer
}{idle: map[netnsID]keptSocket{}}

// namespaceOf identifies netns; nsexec.Current is the namespace of the
// calling thread (a thread locked into another namespace has its own).
func namespaceOf(netns nsexec.NS) (netnsID, error) {
	var st unix.Stat_t
	var err error
	if netns.IsCurrent() {
		err = unix.Stat("/proc/thread-self/ns/net", &st)
	} else {
		err = unix.Fstat(netns.FD(), &st)
	}
	if err != nil {
		return netnsID{}, fmt.Errorf("nft: identify the network namespace: %w", err)
	}
	return netnsID{dev: uint64(st.Dev), ino: st.Ino}, nil
}

// socket is a netlink socket to nf_tables in netns, kept or new.
type socket struct {
	*netlink.Conn
	ns netnsID
}

// takeSocket returns the socket kept for netns, or a new one (widened
// for dumps). Hand it back with done.
func takeSocket(netns nsexec.NS) (socket, error) {
	id, err := namespaceOf(netns)
	if err != nil {
		return socket{}, err
	}
	kept.Lock()
	k, ok := kept.idle[id]
	delete(kept.idle, id)
	kept.Unlock()
	if ok {
		return socket{Conn: k.c, ns: id}, nil
	}
	c, err := dialDumps(netns)
	if err != nil {
		return socket{}, err
	}
	return socket{Conn: c, ns: id}, nil
}

// done hands the socket back after a use that ended with err: it is
// kept unless the use failed or another socket of its namespace already
// is.
func (s socket) done(err error) {
	if err == nil && s.SetDeadline(time.Time{}) == nil {
		kept.Lock()
		if _, full := kept.idle[s.ns]; !full {
			kept.idle[s.ns] = keptSocket{c: s.Conn, used: time.Now()}
			if kept.sweep == nil {
				kept.sweep = time.AfterFunc(idleClose, sweepSockets)
			}
			kept.Unlock()
			return
		}
		kept.Unlock()
	}
	_ = s.Close()
}

// sweepSockets closes the sockets idle for idleClose, and looks again
// while any is left.
func sweepSockets() {
	var idle []*netlink.Conn
	kept.Lock()
	next := time.Duration(0)
	for id, k := range kept.idle {
		if left := idleClose - time.Since(k.used); left > 0 {
			if next == 0 || left < next {
				next = left
			}
			continue
		}
		idle = append(idle, k.c)
		delete(kept.idle, id)
	}
	switch {
	case next == 0:
		kept.sweep = nil
	case kept.sweep == nil:
		kept.sweep = time.AfterFunc(next, sweepSockets)
	default:
		kept.sweep.Reset(next)
	}
	kept.Unlock()
	for _, c := range idle {
		_ = c.Close()
	}
}
