package nftables

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/proxyshift/proxyshift/nodeagent/dataplane"
	dt "github.com/proxyshift/proxyshift/nodeagent/dataplane/dataplanetest"
	"github.com/proxyshift/proxyshift/nodeagent/dataplane/internal/nft/nfttest"
	"github.com/proxyshift/proxyshift/nodeagent/model"
)

// TestKernelHoldsTheGoldenTables programs the table of every golden file
// and checks, with nft (the tool a person debugging a node reaches for),
// that the kernel holds what the golden file says: the golden files are
// checked against the kernel, not only against the code that wrote them.
func TestKernelHoldsTheGoldenTables(t *testing.T) {
	for _, sc := range dt.Scenarios() {
		t.Run(sc.Name, func(t *testing.T) {
			listed, _ := programScenario(t, sc)
			golden, err := os.ReadFile(filepath.Join("testdata", sc.Name+".golden"))
			if err != nil {
				t.Fatal(err)
			}
			nfttest.Equal(t, sc.Name, listed, string(golden))
		})
	}
}

// TestKernelHoldsTheDump does the same for a table of every kind of
// service in both families, after a full and after incremental syncs.
func TestKernelHoldsTheDump(t *testing.T) {
	ns, _ := kernelNS(t)
	b := newBackend(t, ns)
	m := testModel()
	mustSync(t, b, dataplane.SyncRequest{Model: m, Full: true})
	check := func(when string) {
		t.Helper()
		for _, f := range families {
			for _, rs := range b.state[f].ts {
				nfttest.Equal(t, when+", "+f.Name+" "+rs.name, nfttest.List(t, ns.NS(), f.Name, rs.name), rs.String())
			}
		}
	}
	check("full sync")
	v4 := m.Ports[corev1.IPv4Protocol]
	changed := model.ChangeSet{}
	for _, name := range model.SortedNames(v4)[:3] {
		sp := *v4[name]
		sp.Endpoints = sp.Endpoints[:len(sp.Endpoints)/2]
		v4[name] = &sp
		changed[name] = struct{}{}
	}
	mustSync(t, b, dataplane.SyncRequest{Model: m, Changed: changed})
	check("incremental sync")
}

// TestKernelRandomModels programs random models (dataplanetest.RandomModel,
// fixed seeds) into fresh namespaces: the kernel must take every ruleset,
// hold exactly the dump, and count what the sync counted.
func TestKernelRandomModels(t *testing.T) {
	for seed := range uint64(40) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			ns, _ := kernelNS(t)
			b := newBackend(t, ns)
			mustSync(t, b, dataplane.SyncRequest{Model: dt.RandomModel(rand.New(rand.NewPCG(seed, 1)), 8), Full: true})
			for _, f := range families {
				for _, rs := range b.state[f].ts {
					nfttest.Equal(t, f.Name+" "+rs.name, nfttest.List(t, ns.NS(), f.Name, rs.name), rs.String())
				}
			}
		})
	}
}
