package bench

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// TreeSampleEvery is how often the benchmark reads the resident set of a
// program's process tree: an iptables-restore of 5 000 services lives
// about a second.
const TreeSampleEvery = 100 * time.Millisecond

// treeRSS is the resident set, in bytes, of process pid and every
// process descended from it (the iptables-restore and iptables-save runs
// of both programs' iptables modes) at one moment: the sum of their
// resident pages, read from /proc. A process that ends while it is read
// is left out. Sampled every TreeSampleEvery (watchPeak), it misses a
// child that lives less than that: the largest sample is a lower bound
// of the tree's peak, where the program's own VmHWM (PeakRSS) is exact
// for it alone.
//
// A descendant that runs the program's own executable is left out too:
// that is a child between its start and its exec. Go starts a command
// with clone(CLONE_VM|CLONE_VFORK), so until the exec the child shares
// the program's memory, and /proc reports the program's resident set
// for it a second time (a sample of the agent at 5 000 services in
// nftables mode, whose commands take 2 MB, once read 171 MiB for 88). A
// program that ran a real copy of itself would be under-counted; neither
// program does.
func treeRSS(pid int) (int64, error) {
	own, err := residentBytes(pid)
	if err != nil {
		return 0, err
	}
	exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	total := own
	for _, c := range descendants(pid) {
		if cexe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", c)); err == nil && exe != "" && cexe == exe {
			continue
		}
		if rss, err := residentBytes(c); err == nil {
			total += rss
		}
	}
	return total, nil
}

// residentBytes is a process's resident set (the second field of
// /proc/<pid>/statm, in pages).
func residentBytes(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/statm", pid))
	if err != nil {
		return 0, err
	}
	f := bytes.Fields(b)
	if len(f) < 2 {
		return 0, fmt.Errorf("/proc/%d/statm: %q", pid, b)
	}
	pages, err := strconv.ParseInt(string(f[1]), 10, 64)
	return pages * int64(os.Getpagesize()), err
}

// descendants lists the processes descended from pid, from the children
// files of each of its threads (/proc/<pid>/task/<tid>/children): a
// child is listed by the thread that started it.
func descendants(pid int) []int {
	var out []int
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
	for _, t := range tasks {
		b, err := os.ReadFile(t)
		if err != nil {
			continue
		}
		for _, f := range bytes.Fields(b) {
			if c, err := strconv.Atoi(string(f)); err == nil {
				out = append(out, c)
				out = append(out, descendants(c)...)
			}
		}
	}
	return out
}
