package netlab

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"syscall"
	"time"
)

// Proto is a transport protocol the traffic helpers speak.
type Proto string

// The protocols the lab's servers answer on.
const (
	TCP Proto = "tcp"
	UDP Proto = "udp"
)

// ErrorKind says why a request got no answer. The kinds are what a
// service proxy's verdicts look like from the client: a reject is
// Refused at once, a drop is a Timeout, a missing route is Unreachable.
type ErrorKind int

// The kinds of failed requests.
const (
	// Other is any failure not listed below.
	Other ErrorKind = iota
	// Refused is ECONNREFUSED: a TCP reset or an ICMP port unreachable.
	Refused
	// Unreachable is an ICMP host, network or admin unreachable, or no route.
	Unreachable
	// Timeout is no answer within the request's timeout: the packets were
	// dropped somewhere.
	Timeout
	// Reset is an established connection closed or reset under the client.
	Reset
)

// String names the kind.
func (k ErrorKind) String() string {
	switch k {
	case Refused:
		return "refused"
	case Unreachable:
		return "unreachable"
	case Timeout:
		return "timeout"
	case Reset:
		return "reset"
	default:
		return "other"
	}
}

// RequestError is a failed request, classified.
type RequestError struct {
	// Kind classifies Err.
	Kind ErrorKind
	// Elapsed is the time from the start of the request to the failure.
	Elapsed time.Duration
	// Err is the underlying error.
	Err error
}

// Error describes the failure with its kind and how long it took.
func (e *RequestError) Error() string {
	return fmt.Sprintf("%s after %v: %v", e.Kind, e.Elapsed.Round(time.Millisecond), e.Err)
}

// Unwrap returns the underlying error.
func (e *RequestError) Unwrap() error { return e.Err }

// KindOf classifies err; a *RequestError keeps the kind it was given.
func KindOf(err error) ErrorKind {
	var re *RequestError
	switch {
	case errors.As(err, &re):
		return re.Kind
	case errors.Is(err, syscall.ECONNREFUSED):
		return Refused
	case errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH):
		return Unreachable
	case errors.Is(err, os.ErrDeadlineExceeded):
		return Timeout
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE), errors.Is(err, io.EOF):
		return Reset
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return Timeout
	}
	return Other
}

func classify(err error, start time.Time) error {
	if err == nil {
		return nil
	}
	return &RequestError{Kind: KindOf(err), Elapsed: time.Since(start), Err: err}
}

// Dial opens a connection from inside ns to addr, IPv4 or IPv6, within
// timeout. Only the socket's creation needs the namespace; the returned
// connection can be used from any goroutine. Errors are not classified;
// see KindOf.
func (ns *NetNS) Dial(proto Proto, addr netip.AddrPort, timeout time.Duration) (net.Conn, error) {
	network := string(proto) + "4"
	if addr.Addr().Is6() {
		network = string(proto) + "6"
	}
	var c net.Conn
	err := ns.Do(func() error {
		var err error
		c, err = net.DialTimeout(network, addr.String(), timeout)
		return err
	})
	return c, err
}

// Request makes one request from inside ns to a lab server (directly or
// through a service) at addr and returns the name of the server that
// answered. TCP opens a connection and reads the greeting; UDP sends one
// datagram from a fresh socket (so a fresh source port, a fresh conntrack
// entry and a fresh load-balancing decision) and reads the answer. The
// whole request takes at most timeout; a failure is a *RequestError.
func (ns *NetNS) Request(proto Proto, addr netip.AddrPort, timeout time.Duration) (string, error) {
	return ns.request(proto, addr, timeout, false)
}

// RequestReset makes one TCP request as Request does, then ends the
// connection with a reset instead of a FIN exchange. Whatever tracks the
// connection (conntrack, an IPVS connection entry) then forgets it after
// its short CLOSE timeout (10 s) instead of keeping it in TIME_WAIT
// (2 minutes), so state tied to the client's connections ends soon too.
func (ns *NetNS) RequestReset(addr netip.AddrPort, timeout time.Duration) (string, error) {
	return ns.request(TCP, addr, timeout, true)
}

func (ns *NetNS) request(proto Proto, addr netip.AddrPort, timeout time.Duration, reset bool) (string, error) {
	start := time.Now()
	c, err := ns.Dial(proto, addr, timeout)
	if err != nil {
		return "", classify(err, start)
	}
	defer c.Close()
	if tc, ok := c.(*net.TCPConn); ok && reset {
		// Linger 0: Close sends a reset and drops the socket.
		if err := tc.SetLinger(0); err != nil {
			return "", classify(err, start)
		}
	}
	if err := c.SetDeadline(start.Add(timeout)); err != nil {
		return "", classify(err, start)
	}
	var reply string
	switch proto {
	case TCP:
		reply, err = bufio.NewReader(c).ReadString('\n')
	case UDP:
		if _, err = c.Write([]byte("ping")); err == nil {
			buf := make([]byte, 1500)
			var n int
			n, err = c.Read(buf)
			reply = string(buf[:n])
		}
	default:
		err = fmt.Errorf("unknown protocol %q", proto)
	}
	if err != nil {
		return "", classify(err, start)
	}
	name, _, _ := strings.Cut(strings.TrimSuffix(reply, "\n"), " ")
	return name, nil
}

// Tally is the outcome of many requests: answers by server name and
// failures by kind.
type Tally struct {
	// Answers counts the answers by the name of the server that answered.
	Answers map[string]int
	// Failures counts the failed requests by kind.
	Failures map[ErrorKind]int
	// FirstErr is the first failure, for messages.
	FirstErr error
}

// Names lists the servers that answered, sorted.
func (t Tally) Names() []string { return slices.Sorted(maps.Keys(t.Answers)) }

// Answered is the number of requests that got an answer.
func (t Tally) Answered() int {
	n := 0
	for _, c := range t.Answers {
		n += c
	}
	return n
}

// String renders the tally for test messages, e.g.
// "answers map[pod-a:31 pod-b:29] failures map[] first error <nil>".
func (t Tally) String() string {
	return fmt.Sprintf("answers %v failures %v first error %v", t.Answers, t.Failures, t.FirstErr)
}

// Spread makes n requests (see Request) one after the other from inside
// ns to addr, each with its own timeout, and tallies who answered. It
// takes at most n*timeout.
func (ns *NetNS) Spread(proto Proto, addr netip.AddrPort, n int, timeout time.Duration) Tally {
	t := Tally{Answers: map[string]int{}, Failures: map[ErrorKind]int{}}
	for range n {
		name, err := ns.Request(proto, addr, timeout)
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

// Session is a long-lived TCP connection to a lab server, for checking
// that an established connection survives changes made while it is open.
type Session struct {
	// Server is the name of the server that answered the connection.
	Server string
	conn   net.Conn
	r      *bufio.Reader
}

// OpenSession connects from inside ns to addr and reads the server's
// greeting, within timeout. The caller closes the session.
func (ns *NetNS) OpenSession(addr netip.AddrPort, timeout time.Duration) (*Session, error) {
	start := time.Now()
	c, err := ns.Dial(TCP, addr, timeout)
	if err != nil {
		return nil, classify(err, start)
	}
	s := &Session{conn: c, r: bufio.NewReader(c)}
	line, err := s.readLine(start.Add(timeout))
	if err != nil {
		_ = c.Close()
		return nil, classify(err, start)
	}
	s.Server = line
	return s, nil
}

// Exchange sends msg, one line without a newline, on the open connection
// and waits up to timeout for the echo. It fails unless the echo comes
// from the server that answered the connection and carries msg back.
func (s *Session) Exchange(msg string, timeout time.Duration) error {
	start := time.Now()
	if err := s.conn.SetDeadline(start.Add(timeout)); err != nil {
		return classify(err, start)
	}
	if _, err := fmt.Fprintf(s.conn, "%s\n", msg); err != nil {
		return classify(err, start)
	}
	line, err := s.readLine(start.Add(timeout))
	if err != nil {
		return classify(err, start)
	}
	if want := s.Server + " " + msg; line != want {
		return &RequestError{Kind: Other, Elapsed: time.Since(start), Err: fmt.Errorf("echo %q, want %q", line, want)}
	}
	return nil
}

// Close closes the connection.
func (s *Session) Close() error { return s.conn.Close() }

func (s *Session) readLine(deadline time.Time) (string, error) {
	if err := s.conn.SetReadDeadline(deadline); err != nil {
		return "", err
	}
	line, err := s.r.ReadString('\n')
	if err != nil {
		return "", err
	}
	return strings.TrimSuffix(line, "\n"), nil
}
