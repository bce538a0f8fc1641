package realcluster

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/proxyshift/proxyshift/test/netlab"
)

// TestCgroupRemoveKillsAll starts two processes in a node-style cgroup
// (every hierarchy), and checks that remove kills both and removes the
// cgroup from every hierarchy. (Both are the test's children: a killed
// grandchild would become a zombie of this host's init, which does not
// reap; the nodes have an init of their own that does.)
func TestCgroupRemoveKillsAll(t *testing.T) {
	netlab.RequireRoot(t)
	cg, err := createCgroup("/" + netlab.OwnedName(cgroupPrefix, "cgroup-test"))
	if cg != nil {
		t.Cleanup(func() { _ = cg.remove(5 * time.Second) })
	}
	if err != nil {
		t.Fatal(err)
	}
	argv := append(cg.exec(), "sleep", "600")
	waited := make(chan error, 2)
	for range 2 {
		cmd := exec.Command(argv[0], argv[1:]...)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go func() { waited <- cmd.Wait() }()
	}
	// Each shell joins the hierarchies one by one, then execs sleep.
	execd := func() bool {
		n := 0
		for _, pid := range cg.pids() {
			if comm(pid) == "sleep" {
				n++
			}
		}
		return n == 2
	}
	deadline := time.Now().Add(10 * time.Second)
	for !execd() && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	pids := cg.pids()
	if len(pids) != 2 || !execd() {
		t.Fatalf("cgroup holds %v, want both sleeps", pids)
	}
	for _, m := range cg.mounts {
		procs, err := os.ReadFile(filepath.Join(m, cg.Path, "runtime", "cgroup.procs"))
		if err != nil || len(procs) == 0 {
			t.Errorf("hierarchy %s: runtime cgroup.procs %q, %v; want both processes", m, procs, err)
		}
	}
	if err := cg.remove(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	<-waited
	<-waited
	for _, pid := range pids {
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("pid %d survived remove", pid)
		}
	}
	for _, m := range cg.mounts {
		if _, err := os.Stat(filepath.Join(m, cg.Path)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s still exists (%v)", filepath.Join(m, cg.Path), err)
		}
	}
}
