package realcluster

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/proxyshift/proxyshift/test/cluster"
	"github.com/proxyshift/proxyshift/test/harness"
	"github.com/proxyshift/proxyshift/test/netlab"
)

// TestProgramCtrlCAndCrash runs `make cluster-real`'s program
// (hack/cluster-real) with one node as a user would: kubectl works with
// the kubeconfig it prints, and Ctrl-C (SIGINT) removes everything. Then
// it kills a second run with SIGKILL: the node dies with it (its init is
// unshare's --kill-child), and the namespaces and cgroups it could not
// remove are swept by the next start.
func TestProgramCtrlCAndCrash(t *testing.T) {
	if err := CanRun(); err != nil {
		t.Skipf("this machine cannot run kubelets: %v", err)
	}
	bin := filepath.Join(t.TempDir(), "cluster-real")
	build := exec.CommandContext(t.Context(), "go", "build", "-o", bin, "./hack/cluster-real")
	build.Dir = cluster.RepoRoot()
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./hack/cluster-real: %v\n%s", err, out)
	}

	type run struct {
		cmd                *exec.Cmd
		kubeconfig, runDir string
		kubectl            string
		nodeInit           int    // the node's init (its PID namespace's pause)
		prefix             string // of its namespaces' and cgroups' names
	}
	initRE := regexp.MustCompile(`shell: nsenter -t (\d+) `)
	launch := func() *run {
		t.Helper()
		p := harness.StartProgram(t, cluster.RepoRoot(), bin, []string{"-nodes", "1", "-no-workload"}, "client:", 5*time.Minute)
		r := &run{cmd: p.Cmd, kubeconfig: p.Value("kubeconfig"), runDir: p.Value("run dir"),
			prefix: fmt.Sprintf("%s%d-", nsPrefix, p.Cmd.Process.Pid)}
		r.kubectl, _, _ = strings.Cut(p.Value("kubectl"), " ")
		for _, l := range p.Lines {
			if m := initRE.FindStringSubmatch(l); m != nil {
				r.nodeInit, _ = strconv.Atoi(m[1])
			}
		}
		if r.nodeInit == 0 {
			t.Fatalf("the summary names no node init:\n%s", strings.Join(p.Lines, "\n"))
		}
		return r
	}
	owned := func(r *run) []string {
		left, _ := netlab.NamedWithPrefix(r.prefix)
		for _, cg := range ownedCgroups(func(name string) bool { return strings.HasPrefix(name, r.prefix) }) {
			left = append(left, "cgroup "+cg)
		}
		return left
	}
	gone := func(pid int) bool {
		deadline := time.Now().Add(10 * time.Second)
		for syscall.Kill(pid, 0) == nil && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
		return errors.Is(syscall.Kill(pid, 0), syscall.ESRCH)
	}

	r := launch()
	out, err := exec.Command(r.kubectl, "--kubeconfig", r.kubeconfig, "get", "nodes", "-o", "name").CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "node/node-1" {
		t.Errorf("kubectl get nodes with the printed kubeconfig: %v\n%s", err, out)
	}
	if err := r.cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	if err := r.cmd.Wait(); err != nil {
		t.Errorf("the program after Ctrl-C: %v", err)
	}
	if !gone(r.nodeInit) {
		t.Errorf("the node's init %d survived Ctrl-C", r.nodeInit)
	}
	if left := owned(r); len(left) != 0 {
		t.Errorf("left after Ctrl-C: %v", left)
	}
	if _, err := os.Stat(r.runDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("run directory %s left after Ctrl-C (%v)", r.runDir, err)
	}

	// A crash: the node goes with the harness; its namespaces and
	// cgroups stay until the next start sweeps them.
	r = launch()
	if err := r.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = r.cmd.Wait()
	if !gone(r.nodeInit) {
		t.Errorf("the node's init %d survived the harness's SIGKILL", r.nodeInit)
	}
	if left := owned(r); len(left) < 4 {
		t.Errorf("a killed harness should leave its namespaces and cgroups; found %v", left)
	}
	netlab.SweepStale(nsPrefix, t.Logf)
	sweepStaleCgroups(t.Logf)
	if left := owned(r); len(left) != 0 {
		t.Errorf("left after the sweep: %v", left)
	}
	if mounts, err := mountsUnder(r.runDir); err != nil || len(mounts) != 0 {
		t.Errorf("mounts under the killed run's directory: %v %v", mounts, err)
	}
	_ = os.RemoveAll(r.runDir) // a crashed run cannot remove its directory
}
