package nftables

import (
	"fmt"
	"os"
	"testing"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
	"github.com/proxyshift/proxyshift/test/vm"
)

// TestMain loads, inside the test VM (make test-vm, make bench-vm), the
// kernel modules nftables mode needs, which the VM cannot load on demand.
// Elsewhere it loads nothing.
func TestMain(m *testing.M) {
	if err := vm.LoadForModes(nil, v1alpha1.ModeNFTables); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(m.Run())
}
