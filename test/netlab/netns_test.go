package netlab

import (
	"fmt"
	"os"
	"os/exec"
	"sync"
	"testing"

	"github.com/vishvananda/netns"
)

func TestNewNetNSIsolatedAndRemoved(t *testing.T) {
	var name string
	t.Run("create", func(t *testing.T) {
		ns := NewNetNS(t, "probe")
		name = ns.Name
		root, err := netns.Get()
		if err != nil {
			t.Fatal(err)
		}
		defer root.Close()
		if ns.Handle.Equal(root) {
			t.Fatal("new namespace is the test's own namespace")
		}
		var inside netns.NsHandle
		if err := ns.Do(func() error {
			var err error
			inside, err = netns.Get()
			return err
		}); err != nil {
			t.Fatal(err)
		}
		defer inside.Close()
		if !inside.Equal(ns.Handle) {
			t.Fatal("Do did not run inside the namespace")
		}
	})
	if _, err := os.Stat("/run/netns/" + name); !os.IsNotExist(err) {
		t.Fatalf("namespace %s still present after the test: %v", name, err)
	}
}

// TestNewNetNSRemovesWhatAKilledTestLeft checks that the first NewNetNS
// of a test process removes the namespaces a test process that is gone
// left behind (killed before its cleanups ran), and no other.
func TestNewNetNSRemovesWhatAKilledTestLeft(t *testing.T) {
	RequireRoot(t)
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	stale := fmt.Sprintf("%s%d-1-left", nsPrefix, gone.Process.Pid)
	live := OwnedName(nsPrefix, "0-kept")
	for _, name := range []string{stale, live} {
		ns, err := CreateNetNS(name)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = ns.Delete() })
	}
	sweptStale = sync.Once{} // as in a new test process
	NewNetNS(t, "first")
	if _, err := os.Stat("/run/netns/" + stale); !os.IsNotExist(err) {
		t.Errorf("namespace %s of a process that is gone is still there: %v", stale, err)
	}
	if _, err := os.Stat("/run/netns/" + live); err != nil {
		t.Errorf("namespace %s of this live process was removed: %v", live, err)
	}
}
