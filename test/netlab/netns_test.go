package netlab

import (
	"os"
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
