package realcluster

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/proxyshift/proxyshift/test/netlab"
)

// unmountUnder lazily unmounts every mount of the harness's mount
// namespace at or below dir, deepest first. The nodes' mounts live in
// their own mount namespaces and vanish with them; this catches anything
// that reached the host's namespace all the same.
func unmountUnder(dir string) error {
	if dir == "" {
		return nil
	}
	mounts, err := mountsUnder(dir)
	if err != nil {
		return err
	}
	var errs []error
	for i := len(mounts) - 1; i >= 0; i-- {
		if err := syscall.Unmount(mounts[i], syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", mounts[i], err))
		}
	}
	return errors.Join(errs...)
}

// mountsUnder lists the mount points of the harness's mount namespace at
// or below dir, in mount order.
func mountsUnder(dir string) ([]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := unescapeMount(fields[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			out = append(out, mp)
		}
	}
	return out, sc.Err()
}

// sweepStaleCgroups removes the cgroups of harnesses that are gone,
// killing what still runs in them (the containers of a node whose harness
// was killed outlive it only if its PID namespace did, which unshare
// --kill-child prevents; this is the second line).
func sweepStaleCgroups(logf func(string, ...any)) {
	mounts, err := cgroupMounts()
	if err != nil {
		return
	}
	for _, name := range ownedCgroups(func(name string) bool { return netlab.StaleOwned(cgroupPrefix, name) }) {
		cg := &cgroup{Path: "/" + name, mounts: mounts}
		if err := cg.remove(10 * time.Second); err != nil {
			logf("remove stale cgroup %s: %v", name, err)
		} else {
			logf("removed stale cgroup %s (its harness is gone)", name)
		}
	}
}

// Leftovers lists what of the cluster is still on the machine: processes
// in a node's PID namespace or cgroups, the nodes' cgroups (any
// hierarchy), mounts under the run directory in the harness's mount
// namespace (pod volumes, container root filesystems, pod network
// namespaces would show there had they leaked), and the cluster's network
// namespaces. After Close it must be empty.
func (c *Cluster) Leftovers() []string {
	var left []string
	pidNS := map[string]string{}
	cgroups := map[string]bool{}
	for _, n := range c.Nodes {
		if n.pidNS != "" {
			pidNS[n.pidNS] = n.Name
		}
		cgroups[strings.TrimPrefix(n.cfg.CgroupRoot, "/")] = true
	}
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil {
			continue
		}
		if ns, err := os.Readlink(filepath.Join("/proc", p.Name(), "ns", "pid")); err == nil {
			if node, ok := pidNS[ns]; ok {
				left = append(left, fmt.Sprintf("process %d (%s) in %s's PID namespace", pid, comm(pid), node))
				continue
			}
		}
		if b, err := os.ReadFile(filepath.Join("/proc", p.Name(), "cgroup")); err == nil {
			for cg := range cgroups {
				if strings.Contains(string(b), "/"+cg) {
					left = append(left, fmt.Sprintf("process %d (%s) in cgroup /%s", pid, comm(pid), cg))
					break
				}
			}
		}
	}
	for _, name := range ownedCgroups(func(name string) bool { return cgroups[name] }) {
		left = append(left, "cgroup /"+name)
	}
	if mounts, err := mountsUnder(c.RunDir); err == nil {
		for _, m := range mounts {
			left = append(left, "mount "+m)
		}
	}
	names, _ := netlab.NamedWithPrefix(c.namespaces.Prefix())
	for _, name := range names {
		left = append(left, "network namespace "+name)
	}
	return left
}

func comm(pid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	return strings.TrimSpace(string(b))
}
