package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/proxyshift/proxyshift/test/netlab"
)

// A ruleset written by a process in the cgroup shows as the cgroup's
// kernel memory that the deletion of its tables frees: more for a larger
// map, and nothing left in the namespace afterwards.
func TestRulesetKernelMemory(t *testing.T) {
	netlab.RequireRoot(t)
	measure := func(elements int) int64 {
		t.Helper()
		cg, err := newMemcg(fmt.Sprintf("test-%d", elements))
		if err != nil {
			t.Skipf("kernel memory accounting: %v", err)
		}
		defer func() {
			if err := cg.remove(); err != nil {
				t.Error(err)
			}
		}()
		ns := netlab.NewNetNS(t, "kmem")
		var b strings.Builder
		b.WriteString("table ip kmem-test {\n\tmap endpoints {\n\t\ttype ipv4_addr : ipv4_addr\n")
		if elements > 0 {
			b.WriteString("\t\telements = { ")
			for i := range elements {
				if i > 0 {
					b.WriteString(", ")
				}
				fmt.Fprintf(&b, "198.19.%d.%d : 198.18.%d.%d", i/256%256, i%256, i/256%256, i%256)
			}
			b.WriteString(" }\n")
		}
		b.WriteString("\t}\n}\n")
		file := filepath.Join(t.TempDir(), "ruleset.nft")
		if err := os.WriteFile(file, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
		// The shell joins the cgroup, then becomes nft in the namespace.
		script := fmt.Sprintf("echo $$ > %s/cgroup.procs && exec ip netns exec %s nft -f %s", cg.dir, ns.Name, file)
		if out, err := exec.Command("sh", "-c", script).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v: %s", script, err, out)
		}
		got, err := rulesetKernelMemory(context.Background(), cg, ns.NS())
		if err != nil {
			t.Fatal(err)
		}
		if out, err := ns.NS().Output(context.Background(), nil, "nft", "list", "ruleset"); err != nil || len(strings.TrimSpace(string(out))) != 0 {
			t.Errorf("after the measurement the namespace lists %q (%v); want nothing", out, err)
		}
		return got
	}
	// The figures move by some tens of KB (the kernel charges a cgroup in
	// batches per CPU): enough elements make that small.
	const elements = 16384
	empty, full := measure(0), measure(elements)
	// An element of a hash map takes some tens of bytes at least.
	if full-empty < elements*32 || full > 64<<20 {
		t.Errorf("kernel memory of a map of %d elements %d bytes, of the empty map %d; want at least %d bytes more and under 64 MiB", elements, full, empty, elements*32)
	}
	t.Logf("kernel memory: the empty table %d bytes, with %d elements %d (%d an element)", empty, elements, full, (full-empty)/elements)
}

func TestStatValue(t *testing.T) {
	stat := []byte("anon 4096\nfile 0\nkernel 123456\nkernel_stack 16384\n")
	if got, err := statValue(stat, "kernel"); err != nil || got != 123456 {
		t.Errorf("kernel: %d, %v; want 123456", got, err)
	}
	if _, err := statValue(stat, "slab"); err == nil {
		t.Error("a missing key gave no error")
	}
}

// A memory cgroup a killed run left behind goes when the next one is
// made; a live process's stays.
func TestStaleMemcgsAreRemoved(t *testing.T) {
	netlab.RequireRoot(t)
	root, _, err := kernelAccounting()
	if err != nil {
		t.Skipf("kernel memory accounting: %v", err)
	}
	// A pid that is gone: a child that has exited.
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	stale := filepath.Join(root, fmt.Sprintf("%s%d-killed-run", memcgPrefix, gone.Process.Pid))
	live := filepath.Join(root, fmt.Sprintf("%s%d-live-run", memcgPrefix, os.Getppid()))
	for _, dir := range []string{stale, live} {
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	defer os.Remove(live)
	cg, err := newMemcg("sweeper")
	if err != nil {
		t.Fatal(err)
	}
	if err := cg.remove(); err != nil {
		t.Error(err)
	}
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		_ = os.Remove(stale)
		t.Errorf("the killed run's cgroup %s is still there (%v)", stale, err)
	}
	if _, err := os.Stat(live); err != nil {
		t.Errorf("the live process's cgroup %s went: %v", live, err)
	}
}
