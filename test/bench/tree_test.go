package bench

import (
	"context"
	"os"
	"os/exec"
	"slices"
	"testing"
	"time"
)

// The tree's resident set counts the children and grandchildren of the
// process, and the watcher keeps the largest sample.
func TestTreeRSSCountsDescendants(t *testing.T) {
	cmd := exec.Command("sh", "-c", "sleep 30; true") // sh forks sleep: a grandchild
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	self := os.Getpid()
	var found []int
	for deadline := time.Now().Add(5 * time.Second); len(found) < 2 && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		found = descendants(self)
	}
	if !slices.Contains(found, cmd.Process.Pid) || len(found) < 2 {
		t.Fatalf("descendants of %d: %v; want sh (%d) and the sleep it started", self, found, cmd.Process.Pid)
	}
	own, err := residentBytes(self)
	if err != nil {
		t.Fatal(err)
	}
	var kids int64
	for _, p := range found {
		rss, err := residentBytes(p)
		if err != nil || rss <= 0 {
			t.Fatalf("resident set of %d: %d, %v", p, rss, err)
		}
		kids += rss
	}
	tree, err := treeRSS(self)
	if err != nil {
		t.Fatal(err)
	}
	// Our own resident set moves a little between the reads.
	if tree < own+kids/2 || tree <= own {
		t.Errorf("tree %d bytes; own %d and the children's %d", tree, own, kids)
	}
	ctx, cancel := context.WithCancel(context.Background())
	peak := watchPeak(ctx, 10*time.Millisecond, func() (int64, error) { return treeRSS(self) }, nil)
	time.Sleep(50 * time.Millisecond)
	cancel()
	if got := <-peak; got <= own {
		t.Errorf("watched peak %d bytes, not more than the process alone (%d)", got, own)
	}
}

// A descendant running the program's own executable (a child between
// its start and its exec, which shares the program's memory) is not
// counted a second time.
func TestTreeRSSLeavesOutCopiesOfTheProgram(t *testing.T) {
	if os.Getenv("PROXYSHIFT_TREE_TEST_CHILD") != "" {
		time.Sleep(30 * time.Second)
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestTreeRSSLeavesOutCopiesOfTheProgram$")
	cmd.Env = append(os.Environ(), "PROXYSHIFT_TREE_TEST_CHILD=1")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	self := os.Getpid()
	// Wait for the child's runtime to be up: a few MB, against which
	// the program's own resident set moving between reads is small.
	var child int64
	for deadline := time.Now().Add(5 * time.Second); child < 2<<20 && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		child, _ = residentBytes(cmd.Process.Pid)
	}
	if child < 2<<20 {
		t.Fatalf("the child's resident set stayed at %d bytes", child)
	}
	own, err := residentBytes(self)
	if err != nil {
		t.Fatal(err)
	}
	tree, err := treeRSS(self)
	if err != nil {
		t.Fatal(err)
	}
	if tree >= own+child/2 {
		t.Errorf("tree %d bytes: the copy of the program (%d) was counted beside the program (%d)", tree, child, own)
	}
}

// The RSS chart leaves out a program that gave up: its figure is only a
// lower bound.
func TestRSSChartLeavesOutWhatGaveUp(t *testing.T) {
	if _, ok := rssPoint(Result{PeakRSS: 200 << 20, TimedOut: true}); ok {
		t.Error("a program whose first sync gave up is on the chart")
	}
	if v, ok := rssPoint(Result{PeakRSS: 200 << 20}); !ok || v != 200 {
		t.Errorf("a measured program: %v, %v; want 200 MiB", v, ok)
	}
	if _, ok := rssPoint(Result{}); ok {
		t.Error("a program not measured is on the chart")
	}
}
