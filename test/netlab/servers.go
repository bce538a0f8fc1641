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

// Server answers on one port, TCP and UDP, with its name, so a client can
// tell which backend a service sent it to:
//   - TCP: on accept it sends "<name>\n"; then it answers every line
//     "<msg>" it reads with "<name> <msg>\n" until the client closes, so one
//     connection can be held open and checked again later.
//   - UDP: it answers every datagram "<msg>" with "<name> <msg>".
type Server struct {
	name string
	tcp  net.Listener
	udp  net.PacketConn
	wg   sync.WaitGroup

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
}

// StartServer opens a TCP listener and a UDP socket on port, all
// addresses, inside ns, and serves them until Stop.
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
// the calling thread's network namespace, and serves them until Stop: what
// a pod's server process (test/realcluster/podserver) runs.
func Serve(name string, port int) (*Server, error) {
	if strings.ContainsAny(name, " \n") {
		return nil, fmt.Errorf("server name %q: no spaces or newlines", name)
	}
	s := &Server{name: name, conns: map[net.Conn]struct{}{}}
	addr := fmt.Sprintf("0.0.0.0:%d", port)
	var err error
	if s.tcp, err = net.Listen("tcp4", addr); err != nil {
		return nil, fmt.Errorf("server %s: %w", name, err)
	}
	if s.udp, err = net.ListenPacket("udp4", addr); err != nil {
		_ = s.tcp.Close()
		return nil, fmt.Errorf("server %s: %w", name, err)
	}
	s.wg.Add(2)
	go s.acceptTCP()
	go s.serveUDP()
	return s, nil
}

// Stop closes the listeners and every open connection and waits for the
// server's goroutines to end. It may be called more than once.
func (s *Server) Stop() {
	s.mu.Lock()
	if !s.closed {
		s.closed = true
		_ = s.tcp.Close()
		_ = s.udp.Close()
		for c := range s.conns {
			_ = c.Close()
		}
	}
	s.mu.Unlock()
	s.wg.Wait()
}

func (s *Server) acceptTCP() {
	defer s.wg.Done()
	for {
		c, err := s.tcp.Accept()
		if err != nil {
			return // closed by Stop (Go retries transient accept errors itself)
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
		go s.serveConn(c)
	}
}

func (s *Server) serveConn(c net.Conn) {
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

func (s *Server) serveUDP() {
	defer s.wg.Done()
	buf := make([]byte, 1500)
	for {
		n, from, err := s.udp.ReadFrom(buf)
		if err != nil {
			return // closed by Stop; an unconnected socket gets no ICMP errors
		}
		reply := fmt.Sprintf("%s %s", s.name, buf[:n])
		_, _ = s.udp.WriteTo([]byte(reply), from)
	}
}
