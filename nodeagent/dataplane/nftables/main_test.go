package nftables

import (
	"testing"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
	"github.com/proxyshift/proxyshift/test/vm"
)

// TestMain loads, inside the test VM (make test-vm, make bench-vm), the
// kernel modules nftables mode needs, which the VM cannot load on demand.
func TestMain(m *testing.M) { vm.Main(m, nil, v1alpha1.ModeNFTables) }
