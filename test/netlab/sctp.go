package netlab

import (
	"bufio"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// SCTP in the lab. Go has no SCTP package, but a one-to-one style SCTP
// socket (SOCK_STREAM, IPPROTO_SCTP) behaves like a TCP one: connect,
// accept, read and write. So the sockets are made with socket(2) in the
// namespace, and handed to Go's net package as files (net.FileListener
// and net.FileConn take any stream socket of an IP family), which gives
// them deadlines and the runtime's poller. The kernel needs SCTP (the
// sctp module): the test VM loads it; a kernel without it fails socket(2)
// with EPROTONOSUPPORT, which SCTPAvailable tells.

// SCTP is the protocol of SCTPServer and RequestSCTP, for messages
// (Request answers TCP and UDP only).
const SCTP Proto = "sctp"

// SCTPAvailable says whether the calling thread's kernel can open an SCTP
// socket, with the error that tells why not.
func SCTPAvailable() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, unix.IPPROTO_SCTP)
	if err != nil {
		return fmt.Errorf("SCTP socket: %w", err)
	}
	return unix.Close(fd)
}

// SCTPServer answers SCTP associations on one port, as Server does TCP
// connections: on accept it sends "<name>\n", then answers every line
// "<msg>" with "<name> <msg>\n" until the client closes.
type SCTPServer struct {
	*streamServer
	l net.Listener
}

// StartSCTPServer opens an SCTP listener on port, all IPv4 addresses,
// inside ns, and serves it until Stop.
func StartSCTPServer(ns *NetNS, name string, port int) (*SCTPServer, error) {
	s := &SCTPServer{streamServer: newStreamServer(name)}
	err := ns.Do(func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, unix.IPPROTO_SCTP)
		if err != nil {
			return fmt.Errorf("SCTP socket: %w", err)
		}
		f := os.NewFile(uintptr(fd), "sctp-listener")
		defer f.Close()
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1); err != nil {
			return err
		}
		if err := unix.Bind(fd, &unix.SockaddrInet4{Port: port}); err != nil {
			return fmt.Errorf("bind SCTP port %d: %w", port, err)
		}
		if err := unix.Listen(fd, 128); err != nil {
			return err
		}
		s.l, err = net.FileListener(f)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("SCTP server %s in %s: %w", name, ns.Name, err)
	}
	s.serve(s.l)
	return s, nil
}

// Stop closes the listener and every open association and waits for the
// server's goroutines to end. It may be called more than once.
func (s *SCTPServer) Stop() { s.stop(func() { _ = s.l.Close() }) }

// RequestSCTP opens an SCTP association from inside ns to addr, reads the
// server's greeting and returns the name in it, within timeout. A failure
// is a *RequestError: Refused for an ABORT or an ICMP port unreachable
// (see dialSCTP), Timeout when nothing answers.
func (ns *NetNS) RequestSCTP(addr netip.AddrPort, timeout time.Duration) (string, error) {
	start := time.Now()
	c, err := ns.dialSCTP(addr, start.Add(timeout))
	if err != nil {
		return "", classify(err, start)
	}
	defer c.Close()
	if err := c.SetDeadline(start.Add(timeout)); err != nil {
		return "", classify(err, start)
	}
	reply, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return "", classify(err, start)
	}
	return strings.TrimSuffix(reply, "\n"), nil
}

// SpreadSCTP makes n requests (RequestSCTP) one after the other from
// inside ns to addr and tallies who answered, as Spread does for TCP and
// UDP.
func (ns *NetNS) SpreadSCTP(addr netip.AddrPort, n int, timeout time.Duration) Tally {
	t := Tally{Answers: map[string]int{}, Failures: map[ErrorKind]int{}}
	for range n {
		name, err := ns.RequestSCTP(addr, timeout)
		if err != nil {
			t.Failures[KindOf(err)]++
			if t.FirstErr == nil {
				t.FirstErr = err
			}
			continue
		}
		t.Answers[name]++
	}
	return t
}

// dialSCTP connects a non-blocking SCTP socket made in ns to addr, waiting
// until deadline for the association to come up.
func (ns *NetNS) dialSCTP(addr netip.AddrPort, deadline time.Time) (net.Conn, error) {
	if !addr.Addr().Is4() {
		return nil, fmt.Errorf("SCTP to %s: the lab's SCTP client is IPv4 only", addr)
	}
	var fd int
	err := ns.Do(func() error {
		var err error
		fd, err = unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, unix.IPPROTO_SCTP)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("SCTP socket in %s: %w", ns.Name, err)
	}
	f := os.NewFile(uintptr(fd), "sctp-client")
	defer f.Close()
	// SCTP takes an ICMP error (a reject's port unreachable) as a soft
	// error and keeps retrying the INIT, unless the socket asks for
	// errors with IP_RECVERR: with it, a reject fails the connect with
	// ECONNREFUSED at once, and only a drop times out, as for TCP.
	if err := unix.SetsockoptInt(fd, unix.IPPROTO_IP, unix.IP_RECVERR, 1); err != nil {
		return nil, fmt.Errorf("SCTP socket: IP_RECVERR: %w", err)
	}
	if err := bindNextSCTPPort(fd); err != nil {
		return nil, err
	}
	err = unix.Connect(fd, &unix.SockaddrInet4{Addr: addr.Addr().As4(), Port: int(addr.Port())})
	if err == unix.EINPROGRESS {
		err = waitConnected(fd, deadline)
	}
	if err != nil {
		return nil, fmt.Errorf("SCTP connect to %s: %w", addr, err)
	}
	return net.FileConn(f)
}

// The SCTP client's source ports. Linux gives an SCTP socket a random
// free port, unlike TCP's, which moves on from the last port used to the
// same destination; so two of a Spread's 60 associations share a
// source port about once in 16 Spreads. Through IPVS the second of them
// then meets the first one's IPVS connection, still kept (10 s in
// state CLOSED) and with a confirmed conntrack entry: IPVS ends it and
// drops the new INIT so that a fresh connection is scheduled, and the
// client's INIT is sent again only after SCTP's initial retransmission
// timeout, 3 s, beyond a request's timeout. That is the kernel's way
// for every IPVS proxy (kube-proxy's too), not a fault of the rules
// under test, so the lab's client takes its source ports in turn, as a
// TCP client would, and never reuses one within sctpPortsLast -
// sctpPortsFirst associations.
const (
	sctpPortsFirst = 33000
	sctpPortsLast  = 60999
)

// sctpNextPort counts the source ports handed out, in every namespace.
var sctpNextPort atomic.Uint32

// bindNextSCTPPort binds the SCTP socket fd to the next source port in
// turn, skipping ports in use.
func bindNextSCTPPort(fd int) error {
	var err error
	for range 100 {
		port := sctpPortsFirst + int(sctpNextPort.Add(1)-1)%(sctpPortsLast-sctpPortsFirst+1)
		if err = unix.Bind(fd, &unix.SockaddrInet4{Port: port}); err != unix.EADDRINUSE {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("SCTP socket: bind a source port: %w", err)
	}
	return nil
}

// waitConnected waits until the non-blocking connect of fd ends or the
// deadline passes, and returns its outcome.
func waitConnected(fd int, deadline time.Time) error {
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return os.ErrDeadlineExceeded
		}
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLOUT}}
		n, err := unix.Poll(fds, int(left.Milliseconds())+1)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		if n == 0 {
			continue
		}
		soErr, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ERROR)
		if err != nil {
			return err
		}
		if soErr != 0 {
			return unix.Errno(soErr)
		}
		return nil
	}
}
