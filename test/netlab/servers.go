package netlab

import (
	"bufio"
	"fmt"
	"net"
	"strings"
	"sync"
)

// ServerPort is the port pods' TCP and UDP servers listen on; it is the
// target port of the services the tests program.
const ServerPort = 8080

// Server answers on one port, TCP and UDP, IPv4 and (when the kernel has
// it) IPv6, with its name, so a client can tell which backend a service
// sent it to:
//   - TCP: on accept it sends "<name>\n"; then it answers every line
//     "<msg>" it reads with "<name> <msg>\n" until the client closes, so one
//     connection can be held open and checked again later.
//   - UDP: it answers every datagram "<msg>" with "<name> <msg>".
type Server struct {
	*streamServer
	// tcp and udp are the sockets of each family: IPv4, then IPv6.
	tcp []net.Listener
	udp []net.PacketConn
}

// StartServer opens a TCP listener and a UDP socket of each family on
// port, all addresses, inside ns, and serves them until Stop.
func StartServer(ns *NetNS, name string, port int) (*Server, error) {
	var s *Server
	err := ns.Do(func() error {
		var err error
		s, err = Serve(name, port)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("%w (in %s)", err, ns.Name)
	}
	return s, nil
}

// Serve opens a TCP listener and a UDP socket on port, all addresses, in
// the calling thread's network namespace, one of each for IPv4 and, when
// the kernel has IPv6, one of each for IPv6 (IPv6 only, so the families
// never share a socket), and serves them until Stop: what a pod's server
// process (test/realcluster/podserver) runs.
func Serve(name string, port int) (*Server, error) {
	if strings.ContainsAny(name, " \n") {
		return nil, fmt.Errorf("server name %q: no spaces or newlines", name)
	}
	s := &Server{streamServer: newStreamServer(name)}
	families := []struct{ suffix, any string }{{"4", "0.0.0.0"}}
	if HasIPv6() {
		families = append(families, struct{ suffix, any string }{"6", "::"})
	}
	for _, f := range families {
		addr := net.JoinHostPort(f.any, fmt.Sprint(port))
		l, err := net.Listen("tcp"+f.suffix, addr)
		if err != nil {
			s.closeSockets()
			return nil, fmt.Errorf("server %s: %w", name, err)
		}
		s.tcp = append(s.tcp, l)
		u, err := net.ListenPacket("udp"+f.suffix, addr)
		if err != nil {
			s.closeSockets()
			return nil, fmt.Errorf("server %s: %w", name, err)
		}
		s.udp = append(s.udp, u)
	}
	for i := range s.tcp {
		s.serve(s.tcp[i])
		s.wg.Add(1)
		go s.serveUDP(s.udp[i])
	}
	return s, nil
}

// closeSockets closes the listening sockets.
func (s *Server) closeSockets() {
	for _, l := range s.tcp {
		_ = l.Close()
	}
	for _, u := range s.udp {
		_ = u.Close()
	}
}

// Stop closes the listeners and every open connection and waits for the
// server's goroutines to end. It may be called more than once.
func (s *Server) Stop() { s.stop(s.closeSockets) }

func (s *Server) serveUDP(u net.PacketConn) {
	defer s.wg.Done()
	buf := make([]byte, 1500)
	for {
		n, from, err := u.ReadFrom(buf)
		if err != nil {
			return // closed by Stop; an unconnected socket gets no ICMP errors
		}
		reply := fmt.Sprintf("%s %s", s.name, buf[:n])
		_, _ = u.WriteTo([]byte(reply), from)
	}
}

// streamServer answers the connections of stream sockets (Server's TCP,
// SCTPServer's associations) with its name: on accept it sends
// "<name>\n", then answers every line "<msg>" with "<name> <msg>\n"
// until the client closes. It keeps the open connections, which stop
// closes.
type streamServer struct {
	name string
	wg   sync.WaitGroup

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
}

func newStreamServer(name string) *streamServer {
	return &streamServer{name: name, conns: map[net.Conn]struct{}{}}
}

// serve accepts the connections of l, in a goroutine of its own, until l
// is closed.
func (s *streamServer) serve(l net.Listener) {
	s.wg.Add(1)
	go s.accept(l)
}

// stop closes the listeners (closeListeners) and every open connection,
// once, and waits for the server's goroutines to end.
func (s *streamServer) stop(closeListeners func()) {
	s.mu.Lock()
	if !s.closed {
		s.closed = true
		closeListeners()
		for c := range s.conns {
			_ = c.Close()
		}
	}
	s.mu.Unlock()
	s.wg.Wait()
}

func (s *streamServer) accept(l net.Listener) {
	defer s.wg.Done()
	for {
		c, err := l.Accept()
		if err != nil {
			return // closed by stop (Go retries transient accept errors itself)
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			_ = c.Close()
			return
		}
		s.conns[c] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		go s.answer(c)
	}
}

func (s *streamServer) answer(c net.Conn) {
	defer s.wg.Done()
	defer func() {
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		_ = c.Close()
	}()
	if _, err := fmt.Fprintf(c, "%s\n", s.name); err != nil {
		return
	}
	r := bufio.NewReader(c)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return
		}
		if _, err := fmt.Fprintf(c, "%s %s\n", s.name, strings.TrimSuffix(line, "\n")); err != nil {
			return
		}
	}
}
