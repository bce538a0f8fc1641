package iptables

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"

	"github.com/proxyshift/proxyshift/nodeagent/nsexec"
)

// Variant is one of the two backends of iptables 1.8 and later: legacy
// (the kernel's x_tables interface) or nft (iptables rules translated to
// nf_tables). They are separate rule sets in the kernel; a host uses one.
type Variant string

// The iptables variants.
const (
	Legacy Variant = "legacy"
	NFT    Variant = "nft"
)

// other returns the variant that is not v.
func (v Variant) other() Variant {
	if v == Legacy {
		return NFT
	}
	return Legacy
}

// Option configures a Backend, Detect or KernelFacts.
type Option func(*options)

type options struct {
	variant   Variant
	netns     nsexec.NS
	localhost bool
	procSys   string
}

// WithVariant makes New use variant v instead of detecting the one the
// host uses. Detect and KernelFacts ignore it.
func WithVariant(v Variant) Option {
	return func(o *options) { o.variant = v }
}

// WithNetNS runs the iptables tools in network namespace ns instead of
// the caller's. The caller keeps ns open while the backend is used.
func WithNetNS(ns nsexec.NS) Option {
	return func(o *options) { o.netns = ns }
}

// WithLocalhostNodePorts makes NodePorts answer on 127.0.0.1 (and the
// rest of 127.0.0.0/8) for clients on the node, as kube-proxy's iptables
// mode does with iptables.localhostNodePorts (its default): IPv4 only,
// when NodePorts answer on every local address or nodePortAddresses
// holds a loopback address. Each full sync then sets the sysctl
// net.ipv4.conf.all.route_localnet to 1 in the backend's namespace, and
// the filter table drops new connections to 127.0.0.0/8 from other
// sources, which that sysctl would otherwise let in. See the README.
func WithLocalhostNodePorts(on bool) Option {
	return func(o *options) { o.localhost = on }
}

// WithProcSys makes the backend read and write its sysctl
// (route_localnet, see WithLocalhostNodePorts) under dir instead of
// /proc/sys, as the ipvs backend's option of that name does.
func WithProcSys(dir string) Option {
	return func(o *options) { o.procSys = dir }
}

func newOptions(opts []Option) options {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	return o
}

// runner runs the iptables tools of one variant in a network namespace.
// A process inherits the namespace of the thread that starts it, so
// nsexec starts each one from a thread switched into the namespace.
type runner struct {
	variant Variant
	netns   nsexec.NS
}

// command names the tool op ("restore", "save") of the variant for
// family f, such as iptables-nft-restore.
func (r runner) command(f *family, op string) string {
	return f.tool + "-" + string(r.variant) + "-" + op
}

// tool names the variant's tool set for family f in messages, such as
// ip6tables-legacy.
func (r runner) tool(f *family) string { return f.tool + "-" + string(r.variant) }

// installed says whether the restore and save commands of both families
// are installed, naming the first missing one if not.
func (r runner) installed() (bool, string) {
	for _, f := range families {
		for _, op := range []string{"restore", "save"} {
			if _, err := lookPath(r.command(f, op)); err != nil {
				return false, r.command(f, op)
			}
		}
	}
	return true, ""
}

// lookPath finds a command in $PATH, or in /usr/sbin or /sbin, which
// container images do not always have in $PATH.
func lookPath(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	for _, dir := range []string{"/usr/sbin", "/sbin"} {
		if p, err := exec.LookPath(filepath.Join(dir, name)); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("iptables: %s: %w", name, exec.ErrNotFound)
}

// save returns the output of iptables-save for family f: every table the
// variant has.
func (r runner) save(ctx context.Context, f *family) ([]byte, error) {
	return r.run(ctx, r.command(f, "save"))
}

// restore runs iptables-restore --noflush for family f with input, one
// transaction per table, writing the input while the command reads it:
// at 10 000 services (130 000 lines, 15 MB) the command's parsing, on one
// CPU, then overlaps the writing. -w waits for the xtables lock, which
// the legacy variant takes. The command runs with restoreTunables.
func (r runner) restore(ctx context.Context, f *family, input restoreInput) error {
	path, err := lookPath(r.command(f, "restore"))
	if err != nil {
		return err
	}
	if _, err := r.netns.OutputFrom(ctx, restoreTunables, input.writeTo, path, "-w", "5", "--noflush"); err != nil {
		return fmt.Errorf("iptables: %w%s", err, quoteFailedLine(err, input))
	}
	return nil
}

// failedLine finds the input line iptables-restore names when it stops:
// "line 4 failed" when the kernel refused a table's transaction, "Error
// occurred at line: 4" when it could not parse a line.
var failedLine = regexp.MustCompile(`\bline:? ([0-9]+)`)

// maxQuoted bounds the quoted line: a rule with many source ranges can be
// long, and the error ends up in a ProxyNode condition.
const maxQuoted = 512

// quoteFailedLine returns ` (input line N: "...")`, the line of input a
// failed restore's stderr names, or "" when it names none. The input is
// not kept while it is written (runner.restore streams it), so it is
// written again here, on the error path only: the restore's own message
// gives a line number, which tells a user nothing without the line.
func quoteFailedLine(err error, input restoreInput) string {
	var ne *nsexec.Error
	if !errors.As(err, &ne) {
		return ""
	}
	m := failedLine.FindStringSubmatch(ne.Stderr)
	if m == nil {
		return ""
	}
	n, _ := strconv.Atoi(m[1])
	var text bytes.Buffer
	if input.writeTo(&text) != nil {
		return ""
	}
	rest := text.Bytes()
	for i := 1; i < n; i++ {
		_, after, found := bytes.Cut(rest, []byte("\n"))
		if !found {
			return ""
		}
		rest = after
	}
	line, _, _ := bytes.Cut(rest, []byte("\n"))
	if n < 1 || len(rest) == 0 {
		return ""
	}
	if len(line) > maxQuoted {
		line = append(line[:maxQuoted:maxQuoted], "..."...)
	}
	return fmt.Sprintf(" (input line %d: %q)", n, line)
}

// restoreTunables set glibc's allocator for iptables-restore, which
// allocates its whole transaction in small pieces before it sends it (at
// 10 000 services 120 000 rules, 184 MB resident): its heap grows 256 MiB
// at a time (top_pad; the default is 128 KiB) and is backed by
// transparent huge pages where the kernel offers them on request
// (hugetlb=1, glibc 2.35 and later; a glibc that does not know a tunable
// ignores it). Page faults and the allocator's bookkeeping were a third
// of the restore's time: by hand at 10 000 services, six alternating
// pairs, a median of 2.53 s without and 2.07 s with, for about 20 MB more
// resident (see the README). A GLIBC_TUNABLES of the agent's own
// environment wins.
var restoreTunables = []string{"GLIBC_TUNABLES=glibc.malloc.top_pad=268435456:glibc.malloc.hugetlb=1"}

// run runs a command and returns its stdout; the error carries its
// stderr.
func (r runner) run(ctx context.Context, name string, args ...string) ([]byte, error) {
	path, err := lookPath(name)
	if err != nil {
		return nil, err
	}
	out, err := r.netns.Output(ctx, nil, path, args...)
	if err != nil {
		return nil, fmt.Errorf("iptables: %w", err)
	}
	return out, nil
}

// errNotInstalled is returned for a variant whose tools are missing.
var errNotInstalled = errors.New("not installed")
