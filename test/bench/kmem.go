package bench

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/proxyshift/proxyshift/nodeagent/nsexec"
	"github.com/proxyshift/proxyshift/test/netlab"
)

// The kernel memory of a ruleset. nf_tables charges what it allocates for
// a table, chain, rule, set or element to the memory cgroup of the
// process whose netlink request created it, and uncharges it there when
// the object is freed. A program run in a memory cgroup of its own
// therefore shows its ruleset's kernel memory as the drop in the cgroup's
// kernel usage when the tables are deleted after the program has
// stopped; what else its processes left charged (cached directory
// entries and the like) does not drop, and what others created in the
// namespace is charged elsewhere. Unlike `nft list ruleset`, this counts
// what the kernel holds: an interval of a named map is two tree nodes,
// an anonymous map written in a rule a set of its own.

// memcg is a memory cgroup made for one program run.
type memcg struct {
	dir string
	// kernel reads the cgroup's kernel memory in bytes.
	kernel func() (int64, error)
}

// The memory controller's mount points: cgroup v1's own hierarchy, or
// the unified hierarchy of cgroup v2.
const (
	memcgV1Root = "/sys/fs/cgroup/memory"
	memcgV2Root = "/sys/fs/cgroup"
)

// errNoKernelAccounting says this machine offers no per-cgroup kernel
// memory figure.
var errNoKernelAccounting = errors.New("no memory cgroup with a kernel memory figure (cgroup v1 memory.kmem.usage_in_bytes, or cgroup v2 memory.stat \"kernel\")")

// memcgPrefix starts the names of the memory cgroups the benchmark and
// its tests make, "<prefix><pid>-<what>" (netlab.OwnedName).
const memcgPrefix = "proxyshift-bench-"

// newMemcg makes a memory cgroup below the controller's root, named for
// this process and what, after removing those a killed run left (an
// empty cgroup whose process is gone).
func newMemcg(what string) (*memcg, error) {
	root, kernel, err := kernelAccounting()
	if err != nil {
		return nil, err
	}
	if ents, err := os.ReadDir(root); err == nil {
		for _, e := range ents {
			if e.IsDir() && netlab.StaleOwned(memcgPrefix, e.Name()) {
				_ = os.Remove(filepath.Join(root, e.Name()))
			}
		}
	}
	dir := filepath.Join(root, netlab.OwnedName(memcgPrefix, what))
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, err
	}
	return &memcg{dir: dir, kernel: func() (int64, error) { return kernel(dir) }}, nil
}

// kernelAccounting finds the memory controller's root and how a cgroup
// of it tells its kernel memory: cgroup v1's memory.kmem.usage_in_bytes,
// or the "kernel" line of cgroup v2's memory.stat.
func kernelAccounting() (root string, kernel func(dir string) (int64, error), err error) {
	if _, err := os.Stat(filepath.Join(memcgV1Root, "memory.kmem.usage_in_bytes")); err == nil {
		return memcgV1Root, func(dir string) (int64, error) {
			b, err := os.ReadFile(filepath.Join(dir, "memory.kmem.usage_in_bytes"))
			if err != nil {
				return 0, err
			}
			return strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		}, nil
	}
	controllers, err := os.ReadFile(filepath.Join(memcgV2Root, "cgroup.subtree_control"))
	if err != nil || !slices.Contains(strings.Fields(string(controllers)), "memory") {
		return "", nil, errNoKernelAccounting
	}
	return memcgV2Root, func(dir string) (int64, error) {
		b, err := os.ReadFile(filepath.Join(dir, "memory.stat"))
		if err != nil {
			return 0, err
		}
		return statValue(b, "kernel")
	}, nil
}

// statValue is the value of key in a memory.stat file ("key value" lines).
func statValue(stat []byte, key string) (int64, error) {
	sc := bufio.NewScanner(bytes.NewReader(stat))
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), " "); ok && k == key {
			return strconv.ParseInt(v, 10, 64)
		}
	}
	return 0, fmt.Errorf("memory.stat has no %q: %w", key, errNoKernelAccounting)
}

// add moves the process pid into the cgroup; what it and the processes
// it starts allocate from then on is charged there.
func (m *memcg) add(pid int) error {
	if pid <= 0 {
		// Writing 0 would move the writer itself.
		return fmt.Errorf("no process to add (pid %d)", pid)
	}
	return os.WriteFile(filepath.Join(m.dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644)
}

// remove deletes the cgroup once no process is left in it (the
// children of a stopped program may take a moment to exit), waiting up
// to 10 seconds.
func (m *memcg) remove() error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := os.Remove(m.dir)
		if err == nil || !errors.Is(err, syscall.EBUSY) || time.Now().After(deadline) {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// rulesetKernelMemory deletes every table in ns and returns how far the
// cgroup's kernel memory fell once the freeing settled (nf_tables frees
// what a transaction deleted after an RCU grace period, from a work
// queue): the kernel memory of the ruleset the cgroup's processes made.
func rulesetKernelMemory(ctx context.Context, m *memcg, ns nsexec.NS) (int64, error) {
	before, err := m.kernel()
	if err != nil {
		return 0, err
	}
	if _, err := ns.Output(ctx, nil, "nft", "flush", "ruleset"); err != nil {
		return 0, fmt.Errorf("nft flush ruleset: %w", err)
	}
	after, err := settledKernel(ctx, m, 100*time.Millisecond, 10*time.Second)
	if err != nil {
		return 0, err
	}
	return before - after, nil
}

// settledKernel reads the cgroup's kernel memory every interval until
// five reads in a row agree, or until timeout has passed, and returns
// the last read.
func settledKernel(ctx context.Context, m *memcg, interval, timeout time.Duration) (int64, error) {
	deadline := time.Now().Add(timeout)
	last, err := m.kernel()
	if err != nil {
		return 0, err
	}
	for same := 0; same < 4 && time.Now().Before(deadline); {
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(interval):
		}
		cur, err := m.kernel()
		if err != nil {
			return 0, err
		}
		if cur == last {
			same++
		} else {
			same = 0
		}
		last = cur
	}
	return last, nil
}
