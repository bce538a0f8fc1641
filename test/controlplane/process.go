package controlplane

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/proxyshift/proxyshift/test/netlab"
)

// Process is one of a cluster's programs (etcd, kube-apiserver, the
// operator, an agent, a kubelet) running inside a network namespace
// through `ip netns exec` (or another command that enters namespaces, see
// Enter), with its output appended to a log file. It runs in its own
// process group, so a Ctrl-C in the terminal reaches only the harness,
// which then stops the processes in order; and it gets SIGKILL should the
// harness die without cleaning up (see spawn).
type Process struct {
	// Name identifies the process in messages ("agent node-1").
	Name string
	// NS is the namespace the process runs in.
	NS *netlab.NetNS
	// Path and Args are the program and its arguments.
	Path string
	Args []string
	// Log is the file stdout and stderr are appended to.
	Log string
	// Env is the process's environment (nil: the harness's) and Dir its
	// working directory (empty: the harness's).
	Env []string
	Dir string
	// Enter, when set, is the command line that enters the process's
	// namespaces and runs the program given after it, in place of
	// `ip netns exec NS` (say, nsenter into a node's mount, network and
	// PID namespaces).
	Enter []string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when the current run has exited
	err  error         // the current run's exit status, once done
	runs int
}

// Start runs the process. It fails if it is already running.
func (p *Process) Start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil && !isClosed(p.done) {
		return fmt.Errorf("%s is already running (pid %d)", p.Name, p.cmd.Process.Pid)
	}
	logf, err := os.OpenFile(p.Log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	p.runs++
	fmt.Fprintf(logf, "==== %s: start #%d in %s: %s %s\n", time.Now().Format(time.RFC3339Nano), p.runs, p.NS.Name, p.Path, strings.Join(p.Args, " "))
	argv := append(p.enter(), p.Path)
	cmd := exec.Command(argv[0], append(argv[1:], p.Args...)...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = p.Env
	cmd.Dir = p.Dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := spawn(cmd); err != nil {
		_ = logf.Close()
		return fmt.Errorf("start %s: %w", p.Name, err)
	}
	done := make(chan struct{})
	p.cmd, p.done, p.err = cmd, done, nil
	go func() {
		err := cmd.Wait()
		fmt.Fprintf(logf, "==== %s: exited: %v\n", time.Now().Format(time.RFC3339Nano), exitText(err))
		_ = logf.Close()
		p.mu.Lock()
		if p.cmd == cmd {
			p.err = err
		}
		p.mu.Unlock()
		close(done)
	}()
	return nil
}

// enter is the command line prefix that runs the program in its namespaces.
func (p *Process) enter() []string {
	if len(p.Enter) > 0 {
		return slices.Clone(p.Enter)
	}
	return []string{IPPath(), "netns", "exec", p.NS.Name}
}

// Pid is the running process's id (0 when not running).
func (p *Process) Pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || isClosed(p.done) {
		return 0
	}
	return p.cmd.Process.Pid
}

// Running tells whether the process runs.
func (p *Process) Running() bool { return p.Pid() != 0 }

// Exited returns a channel closed when the current run ends, and a
// function giving its exit error (nil for exit status 0). Before any run
// the channel is closed.
func (p *Process) Exited() (<-chan struct{}, func() error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	done := p.done
	if done == nil {
		c := make(chan struct{})
		close(c)
		return c, func() error { return errors.New("never started") }
	}
	return done, func() error {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.err
	}
}

// Kill sends SIGKILL to the process's group (kill -9: no cleanup of any
// kind) and waits for it to be gone (up to 30 seconds: a large process
// on a loaded machine takes a while to be torn down). Killing a stopped
// process is a no-op.
func (p *Process) Kill() error { return p.signalAndWait(syscall.SIGKILL, 30*time.Second) }

// Stop sends SIGTERM and waits up to grace for the process to exit, then
// kills it. Stopping a stopped process is a no-op.
func (p *Process) Stop(grace time.Duration) error {
	if err := p.signalAndWait(syscall.SIGTERM, grace); err == nil {
		return nil
	}
	return p.Kill()
}

// Restart stops the process (SIGTERM, 10 seconds of grace) and starts it
// again with the same arguments.
func (p *Process) Restart() error {
	if err := p.Stop(10 * time.Second); err != nil {
		return err
	}
	return p.Start()
}

func (p *Process) signalAndWait(sig syscall.Signal, wait time.Duration) error {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	if cmd == nil || isClosed(done) {
		return nil
	}
	// The process leads its own group (Setpgid): signal the group.
	if err := syscall.Kill(-cmd.Process.Pid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("signal %s: %w", p.Name, err)
	}
	select {
	case <-done:
		return nil
	case <-time.After(wait):
		return fmt.Errorf("%s (pid %d) did not exit within %v of %v", p.Name, cmd.Process.Pid, wait, sig)
	}
}

func isClosed(c chan struct{}) bool {
	if c == nil {
		return true
	}
	select {
	case <-c:
		return true
	default:
		return false
	}
}

func exitText(err error) string {
	if err == nil {
		return "exit status 0"
	}
	return err.Error()
}

// LastRunLog returns what the last run of a process wrote to its log,
// shortened to its beginning and its end when long: the first lines say
// why a program refused to start, the last ones why it stopped.
func LastRunLog(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	s := string(b)
	if j := strings.LastIndex(s, ": start #"); j >= 0 {
		if k := strings.LastIndex(s[:j], "==== "); k >= 0 {
			s = s[k:]
		}
	}
	const head, tail = 1200, 2400
	if len(s) > head+tail {
		s = s[:head] + "\n[...]\n" + s[len(s)-tail:]
	}
	return s
}

var (
	ipOnce sync.Once
	ipBin  = "ip"
)

// IPPath is the ip(8) binary (iproute2), looked up once.
func IPPath() string {
	ipOnce.Do(func() {
		for _, p := range []string{"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"} {
			if _, err := os.Stat(p); err == nil {
				ipBin = p
				return
			}
		}
		if p, err := exec.LookPath("ip"); err == nil {
			ipBin = p
		}
	})
	return ipBin
}

// Spawn starts cmd (for a command a harness runs and waits for itself)
// from the harness's spawner thread: see spawn.
func Spawn(cmd *exec.Cmd) error { return spawn(cmd) }

// spawn starts cmd from one OS thread that stays locked for the life of
// the program. Pdeathsig fires when the *thread* that forked the child
// exits, not the process; the Go runtime destroys a thread whenever a
// goroutine that locked it exits locked (the netlab helpers do that when a
// namespace cannot be left), so a child forked from an arbitrary thread
// could be killed at a random moment. The spawner thread never exits, so
// children die only with the harness.
func spawn(cmd *exec.Cmd) error {
	spawnOnce.Do(func() {
		spawnReqs = make(chan spawnReq)
		go func() {
			runtime.LockOSThread() // never unlocked: this thread lives as long as the program
			for r := range spawnReqs {
				r.errc <- r.cmd.Start()
			}
		}()
	})
	errc := make(chan error, 1)
	spawnReqs <- spawnReq{cmd: cmd, errc: errc}
	return <-errc
}

type spawnReq struct {
	cmd  *exec.Cmd
	errc chan error
}

var (
	spawnOnce sync.Once
	spawnReqs chan spawnReq
)

// WaitFor polls check every interval until it succeeds, ctx ends, or a
// process of procs exits (then the error quotes its log's end).
func WaitFor(ctx context.Context, what string, interval time.Duration, procs []*Process, check func(context.Context) error) error {
	var last error
	for {
		// A process that exited fails the wait at once, before a check
		// that would wait for it in vain.
		for _, p := range procs {
			if done, exitErr := p.Exited(); isClosedRO(done) {
				return fmt.Errorf("%s: %s exited (%v); end of %s:\n%s", what, p.Name, exitText(exitErr()), p.Log, LastRunLog(p.Log))
			}
		}
		if last = check(ctx); last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: %w; last error: %v", what, ctx.Err(), last)
		case <-time.After(interval):
		}
	}
}

func isClosedRO(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}
