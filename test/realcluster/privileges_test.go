package realcluster

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// Linux capability numbers (linux/capability.h).
const (
	capNetAdmin  = 12
	capNetRaw    = 13
	capSysModule = 16
)

// procStatus is what /proc/PID/status says of a process's privileges.
type procStatus struct {
	pid                 int
	uid                 string // the effective uid
	capEff, capBnd      uint64
	noNewPrivs, seccomp string
}

// findProcesses lists the host's processes in one of the cgroups below
// roots (the nodes' kubelet cgroup roots: other tests may run agents and
// operators on the machine at the same time) whose command line contains
// every one of words, with their privileges as the kernel sees them.
func findProcesses(roots []string, words ...string) ([]procStatus, error) {
	dirs, err := filepath.Glob("/proc/[0-9]*")
	if err != nil {
		return nil, err
	}
	var out []procStatus
	for _, d := range dirs {
		cmd, err := os.ReadFile(d + "/cmdline")
		if err != nil {
			continue
		}
		line := string(bytes.ReplaceAll(cmd, []byte{0}, []byte{' '}))
		match := true
		for _, w := range words {
			match = match && strings.Contains(line, w)
		}
		if !match || !inCgroups(d, roots) {
			continue
		}
		st, err := os.ReadFile(d + "/status")
		if err != nil {
			continue
		}
		p := procStatus{}
		p.pid, _ = strconv.Atoi(filepath.Base(d))
		for _, l := range strings.Split(string(st), "\n") {
			k, v, _ := strings.Cut(l, ":")
			v = strings.TrimSpace(v)
			switch k {
			case "Uid":
				if f := strings.Fields(v); len(f) > 1 {
					p.uid = f[1]
				}
			case "CapEff":
				p.capEff, _ = strconv.ParseUint(v, 16, 64)
			case "CapBnd":
				p.capBnd, _ = strconv.ParseUint(v, 16, 64)
			case "NoNewPrivs":
				p.noNewPrivs = v
			case "Seccomp":
				p.seccomp = v
			}
		}
		out = append(out, p)
	}
	return out, nil
}

// checkPrivileges reads, from the host's /proc, the privileges the
// container runtime actually gave the agents and the operator under the
// shipped manifests: each agent is root with exactly NET_ADMIN, NET_RAW
// and SYS_MODULE (effective and bounding), no new privileges, seccomp
// filtering, /proc/sys read-only but the host's /proc/sys/net mounted
// read-write for the IPVS mode's sysctls; the operator runs as uid 65532 with no capability at all.
func checkPrivileges(t *testing.T, c *Cluster) {
	want := uint64(1<<capNetAdmin | 1<<capNetRaw | 1<<capSysModule)
	var roots []string
	for _, n := range c.Nodes {
		roots = append(roots, n.cfg.CgroupRoot)
	}
	for _, n := range c.Nodes {
		ps, err := findProcesses([]string{n.cfg.CgroupRoot}, "proxyshift-agent", "--node-name="+n.Name)
		if err != nil {
			t.Fatal(err)
		}
		if len(ps) != 1 {
			t.Fatalf("%s: %d agent processes, want 1", n.Name, len(ps))
		}
		p := ps[0]
		if p.uid != "0" || p.capEff != want || p.capBnd != want || p.noNewPrivs != "1" || p.seccomp != "2" {
			t.Errorf("%s: agent (pid %d): uid %s, CapEff %#x, CapBnd %#x, NoNewPrivs %s, Seccomp %s; want uid 0, both %#x (NET_ADMIN, NET_RAW, SYS_MODULE), 1, 2 (filter)",
				n.Name, p.pid, p.uid, p.capEff, p.capBnd, p.noNewPrivs, p.seccomp, want)
		}
		t.Logf("%s: agent pid %d: uid %s, CapEff %#x, NoNewPrivs %s, Seccomp %s", n.Name, p.pid, p.uid, p.capEff, p.noNewPrivs, p.seccomp)
		// Its own /proc/sys is read-only; the host's /proc/sys/net is
		// mounted read-write for the IPVS mode's sysctls.
		for _, m := range []struct{ point, fstype, mode string }{{"/proc/sys", "proc", "ro"}, {"/host/proc/sys/net", "proc", "rw"}} {
			if got, err := mountOf(p.pid, m.point); err != nil || got.fstype != m.fstype || got.mode != m.mode {
				t.Errorf("%s: agent's %s: %+v %v; want a %s mount, %s", n.Name, m.point, got, err, m.fstype, m.mode)
			}
		}
	}
	ps, err := findProcesses(roots, "proxyshift-operator", "--leader-elect")
	if err != nil {
		t.Fatal(err)
	}
	if len(ps) != 1 {
		t.Fatalf("%d operator processes, want 1", len(ps))
	}
	if p := ps[0]; p.uid != "65532" || p.capEff != 0 || p.noNewPrivs != "1" || p.seccomp != "2" {
		t.Errorf("operator (pid %d): uid %s, CapEff %#x, NoNewPrivs %s, Seccomp %s; want uid 65532, no capability, 1, 2", p.pid, p.uid, p.capEff, p.noNewPrivs, p.seccomp)
	} else {
		t.Logf("operator pid %d: uid %s, CapEff %#x, NoNewPrivs %s, Seccomp %s", p.pid, p.uid, p.capEff, p.noNewPrivs, p.seccomp)
	}
}

// mount is one line of /proc/PID/mountinfo, as much as the checks read.
type mount struct{ fstype, mode string }

// mountOf finds the mount at point in process pid's mount namespace.
func mountOf(pid int, point string) (mount, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/mountinfo")
	if err != nil {
		return mount{}, err
	}
	var found mount
	ok := false
	for _, l := range strings.Split(string(b), "\n") {
		// id parent major:minor root point options [optional...] - fstype source super-options
		pre, post, cut := strings.Cut(l, " - ")
		f := strings.Fields(pre)
		if !cut || len(f) < 6 || f[4] != point {
			continue
		}
		mode, _, _ := strings.Cut(f[5], ",")
		found, ok = mount{fstype: strings.Fields(post)[0], mode: mode}, true // the last one mounted there wins
	}
	if !ok {
		return mount{}, os.ErrNotExist
	}
	return found, nil
}

// inCgroups says whether the process whose /proc directory is dir is in a
// cgroup at or below one of roots, in any hierarchy.
func inCgroups(dir string, roots []string) bool {
	b, err := os.ReadFile(dir + "/cgroup")
	if err != nil {
		return false
	}
	for _, l := range strings.Split(string(b), "\n") {
		parts := strings.SplitN(l, ":", 3)
		if len(parts) != 3 {
			continue
		}
		for _, r := range roots {
			if parts[2] == r || strings.HasPrefix(parts[2], r+"/") {
				return true
			}
		}
	}
	return false
}
