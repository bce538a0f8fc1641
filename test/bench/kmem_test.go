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
		cg, err := newMemcg(fmt.Sprintf("proxyshift-kmem-test-%d-%d", os.Getpid(), elements))
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
				fmt.Fprintf(&b, "198.19.%d.%d : 198.18.%d.%d", i/256, i%256, i/256, i%256)
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
	empty, full := measure(0), measure(4096)
	// An element of a hash map takes some tens of bytes at least.
	if full-empty < 4096*32 || full > 64<<20 {
		t.Errorf("kernel memory of a map of 4096 elements %d bytes, of the empty map %d; want at least 128 KiB more and under 64 MiB", full, empty)
	}
	t.Logf("kernel memory: the empty table %d bytes, with 4096 elements %d (%d an element)", empty, full, (full-empty)/4096)
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
