package realcluster

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// cgroupPrefix starts the names of the cgroups the harness creates
// ("/psr-<pid>-<cluster>-<node>"); like the namespaces' names they carry
// the harness's pid, so a later run removes what a killed run left.
const cgroupPrefix = "psr-"

// cgroup is one cgroup path present in every mounted hierarchy (the host
// mounts cgroup v1, one hierarchy per controller, plus the v2 "unified"
// one): each node has one, holding its containerd and kubelet (runtime/)
// and, as the kubelet's cgroupRoot, its pods (kubepods/).
type cgroup struct {
	// Path is the cgroup's path inside each hierarchy ("/psr-...-node-1").
	Path string
	// mounts are the hierarchies' mount points.
	mounts []string
}

// cgroupMounts lists the mount points of every cgroup hierarchy (v1 and
// v2) in the harness's mount namespace.
func cgroupMounts() ([]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var mounts []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// "ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTS [OPTIONAL...] - FSTYPE SOURCE SUPER"
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		fields, fsFields := strings.Fields(pre), strings.Fields(post)
		if len(fields) < 5 || len(fsFields) < 1 {
			continue
		}
		if fsFields[0] == "cgroup" || fsFields[0] == "cgroup2" {
			mounts = append(mounts, unescapeMount(fields[4]))
		}
	}
	return mounts, sc.Err()
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// createCgroup creates path, and path/runtime, in every hierarchy. A new
// cpuset cgroup starts with no CPUs and no memory nodes, where no process
// may run: it gets its parent's.
func createCgroup(path string) (*cgroup, error) {
	mounts, err := cgroupMounts()
	if err != nil {
		return nil, err
	}
	if len(mounts) == 0 {
		return nil, errors.New("no cgroup hierarchy is mounted")
	}
	cg := &cgroup{Path: path, mounts: mounts}
	for _, m := range mounts {
		for _, dir := range []string{filepath.Join(m, path), filepath.Join(m, path, "runtime")} {
			if err := os.Mkdir(dir, 0o755); err != nil {
				return cg, fmt.Errorf("cgroup: %w", err)
			}
			if err := inheritCpuset(dir); err != nil {
				return cg, err
			}
		}
	}
	return cg, nil
}

// inheritCpuset copies cpuset.cpus and cpuset.mems from dir's parent when
// dir is a v1 cpuset cgroup.
func inheritCpuset(dir string) error {
	for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			return nil // not a v1 cpuset hierarchy
		}
		v, err := os.ReadFile(filepath.Join(filepath.Dir(dir), f))
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, f), v, 0o644); err != nil {
			return fmt.Errorf("%s: %w", filepath.Join(dir, f), err)
		}
	}
	return nil
}

// runtimeProcs are the cgroup.procs files of path/runtime, one per
// hierarchy: a process writing 0 to each joins the node's runtime cgroup.
func (cg *cgroup) runtimeProcs() []string {
	var files []string
	for _, m := range cg.mounts {
		files = append(files, filepath.Join(m, cg.Path, "runtime", "cgroup.procs"))
	}
	return files
}

// exec is the command line prefix that runs a program in path/runtime: a
// shell writes 0 (itself) to its cgroup.procs in every hierarchy, then
// execs the program, which thereby starts inside the cgroup with
// everything it forks. (Cgroup v1 has no way to start a process inside a
// cgroup; v2's clone3 CLONE_INTO_CGROUP does not apply.)
func (cg *cgroup) exec() []string {
	argv := []string{"sh", "-c", `while [ "$1" != -- ]; do echo 0 > "$1"; shift; done; shift; exec "$@"`, "sh"}
	argv = append(argv, cg.runtimeProcs()...)
	return append(argv, "--")
}

// dirs lists the cgroup's directories in every hierarchy, deepest first,
// for removal (a cgroup goes only once its children have).
func (cg *cgroup) dirs() []string {
	var dirs []string
	for _, m := range cg.mounts {
		root := filepath.Join(m, cg.Path)
		_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
	}
	slices.SortFunc(dirs, func(a, b string) int { return strings.Count(b, "/") - strings.Count(a, "/") })
	return dirs
}

// pids lists the processes in the cgroup's tree, any hierarchy.
func (cg *cgroup) pids() []int {
	seen := map[int]bool{}
	var pids []int
	for _, d := range cg.dirs() {
		b, err := os.ReadFile(filepath.Join(d, "cgroup.procs"))
		if err != nil {
			continue
		}
		for _, f := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil && !seen[pid] {
				seen[pid] = true
				pids = append(pids, pid)
			}
		}
	}
	return pids
}

// remove kills every process left in the cgroup's tree (SIGKILL, again
// until none is left or timeout passes) and removes the tree from every
// hierarchy.
func (cg *cgroup) remove(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		pids := cg.pids()
		if len(pids) == 0 {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cgroup %s: processes %v survive SIGKILL", cg.Path, pids)
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(50 * time.Millisecond)
	}
	var errs []error
	for _, d := range cg.dirs() {
		// A cgroup whose last process just exited may be busy a moment.
		var err error
		for try := 0; try < 50; try++ {
			if err = syscall.Rmdir(d); err == nil || errors.Is(err, syscall.ENOENT) {
				err = nil
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("remove cgroup %s: %w", d, err))
		}
	}
	return errors.Join(errs...)
}

// ownedCgroups lists the top-level cgroups, in any hierarchy, whose name
// match accepts.
func ownedCgroups(match func(name string) bool) []string {
	mounts, err := cgroupMounts()
	if err != nil {
		return nil
	}
	var names []string
	for _, m := range mounts {
		ents, err := os.ReadDir(m)
		if err != nil {
			continue
		}
		for _, e := range ents {
			if e.IsDir() && match(e.Name()) && !slices.Contains(names, e.Name()) {
				names = append(names, e.Name())
			}
		}
	}
	return names
}
