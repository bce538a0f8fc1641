// Package nsexec runs code and commands inside a network namespace given
// by a file descriptor, without moving the calling goroutine's thread: the
// agent targets its node's namespace this way in tests (--netns) and, with
// no namespace given, simply runs in its own.
package nsexec

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"

	"github.com/vishvananda/netns"
)

// NS is a network namespace: a file descriptor the caller keeps open, or
// the zero value, Current, for the namespace the process runs in. It is
// the one type the agent names a namespace by: its options, the
// backends, facts, probes, conntrack and cleanup all take one.
type NS int

// Current is the process's own namespace.
const Current NS = 0

// IsCurrent says whether ns is the process's own namespace (the zero
// value, or any value that is no file descriptor).
func (ns NS) IsCurrent() bool { return ns <= 0 }

// FD is the namespace as netlink clients take one (github.com/mdlayher
// netlink's Config.NetNS, google/nftables' WithNetNSFd): its file
// descriptor, or 0 for the caller's.
func (ns NS) FD() int {
	if ns.IsCurrent() {
		return 0
	}
	return int(ns)
}

// Handle returns the namespace as a netns handle, and false for Current
// (netns.None()).
func (ns NS) Handle() (netns.NsHandle, bool) {
	if ns.IsCurrent() {
		return netns.None(), false
	}
	return netns.NsHandle(int(ns)), true
}

// Path is the namespace as libraries that open one by path take it
// (github.com/moby/ipvs): /proc/self/fd/<fd>, or "" for Current.
func (ns NS) Path() string {
	if ns.IsCurrent() {
		return ""
	}
	return fmt.Sprintf("/proc/self/fd/%d", int(ns))
}

// Do runs fn on a locked OS thread inside ns. Sockets fn opens stay in
// ns after it returns; processes it starts run in ns.
func (ns NS) Do(fn func() error) error {
	if ns.IsCurrent() {
		return fn()
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			errc <- err
			return
		}
		defer orig.Close()
		if err := netns.Set(netns.NsHandle(int(ns))); err != nil {
			errc <- fmt.Errorf("enter network namespace: %w", err)
			return
		}
		fnErr := fn()
		if err := netns.Set(orig); err != nil {
			// Leave the thread locked: the runtime discards it.
			errc <- fmt.Errorf("leave network namespace: %w", err)
			return
		}
		runtime.UnlockOSThread()
		errc <- fnErr
	}()
	return <-errc
}

// Output runs a command inside ns, feeding it stdin (none if nil), and
// returns its standard output. The error carries the command line and its
// standard error; errors.Is(err, exec.ErrNotFound) tells a missing
// binary.
func (ns NS) Output(ctx context.Context, stdin []byte, name string, args ...string) ([]byte, error) {
	var write func(io.Writer) error
	if stdin != nil {
		write = func(w io.Writer) error {
			_, err := w.Write(stdin)
			return err
		}
	}
	return ns.OutputFrom(ctx, nil, write, name, args...)
}

// OutputFrom is Output with the standard input written by write (none if
// nil) while the command runs, through a pipe: a command that reads its
// input as it comes (iptables-restore parses line by line) works on the
// first part while write produces the rest. If write fails for any
// reason but the command having closed its end (it stopped reading: its
// own error, which OutputFrom returns, says why), the command is killed
// before its input ends, so that it never acts on a part of it. env
// ("NAME=value") is added to the environment the command inherits; a
// variable the process has already keeps its value.
func (ns NS) OutputFrom(ctx context.Context, env []string, write func(io.Writer) error, name string, args ...string) ([]byte, error) {
	path, err := LookPath(name)
	if err != nil {
		return nil, &Error{Cmd: name, Err: err}
	}
	cmd := exec.CommandContext(ctx, path, args...)
	if len(env) > 0 {
		cmd.Env = os.Environ()
		for _, kv := range env {
			if k, _, _ := strings.Cut(kv, "="); os.Getenv(k) == "" {
				cmd.Env = append(cmd.Env, kv)
			}
		}
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	var stdin io.WriteCloser
	if write != nil {
		if stdin, err = cmd.StdinPipe(); err != nil {
			return nil, &Error{Cmd: name, Err: err}
		}
	}
	// A process inherits the namespace of the thread that starts it.
	if err := ns.Do(cmd.Start); err != nil {
		if stdin != nil {
			stdin.Close()
		}
		return nil, commandError(name, args, err, &stderr)
	}
	var werr error
	abort := false
	if write != nil {
		werr = write(stdin)
		// A broken pipe means the command is gone or going: its exit
		// says why.
		if abort = werr != nil && !errors.Is(werr, syscall.EPIPE); abort {
			_ = cmd.Process.Kill()
		}
		stdin.Close()
	}
	err = cmd.Wait()
	switch {
	case abort:
		return nil, commandError(name, args, fmt.Errorf("write its input: %w", werr), &stderr)
	case err != nil:
		return nil, commandError(name, args, err, &stderr)
	case werr != nil:
		return nil, commandError(name, args, fmt.Errorf("it exited before reading all of its input: %w", werr), &stderr)
	}
	return stdout.Bytes(), nil
}

func commandError(name string, args []string, err error, stderr *bytes.Buffer) *Error {
	return &Error{Cmd: strings.Join(append([]string{name}, args...), " "), Err: err, Stderr: strings.TrimSpace(stderr.String())}
}

// LookPath finds a command in $PATH, or else in /usr/sbin or /sbin,
// which container images do not always have in $PATH.
func LookPath(name string) (string, error) {
	p, err := exec.LookPath(name)
	if err == nil || strings.Contains(name, "/") {
		return p, err
	}
	for _, dir := range []string{"/usr/sbin", "/sbin"} {
		if p, err2 := exec.LookPath(filepath.Join(dir, name)); err2 == nil {
			return p, nil
		}
	}
	return "", err
}

// Error is a failed command.
type Error struct {
	Cmd    string
	Err    error
	Stderr string
}

func (e *Error) Error() string {
	if e.Stderr != "" {
		return fmt.Sprintf("%s: %v: %s", e.Cmd, e.Err, e.Stderr)
	}
	return fmt.Sprintf("%s: %v", e.Cmd, e.Err)
}

// Unwrap returns the underlying error.
func (e *Error) Unwrap() error { return e.Err }
