package agent

import (
	"net/netip"
	"slices"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/proxyshift/proxyshift/api/contract"
	"github.com/proxyshift/proxyshift/api/v1alpha1"
	"github.com/proxyshift/proxyshift/nodeagent/backends"
	"github.com/proxyshift/proxyshift/nodeagent/dataplane"
	"github.com/proxyshift/proxyshift/nodeagent/model"
)

// TestHeldFailureBuildsFromTheSettingsThatServed starts an agent on a
// ProxyNode whose status says the change to its spec failed (Failed,
// Degraded for its generation): the backends are built with the settings
// the serving mode ran with (status.activeSettings, read for
// status.activeMode), not the spec's that failed verification, until the
// spec changes. An agent used to rebuild the mode from the failed spec at
// start and program it unverified. The same holds, until the agent's
// second resolve (kickAfterStart), when the spec changed while no agent
// ran: the switcher then tries the spec's change, verified.
func TestHeldFailureBuildsFromTheSettingsThatServed(t *testing.T) {
	cidrA, cidrB := netip.MustParsePrefix("10.1.0.0/16"), netip.MustParsePrefix("10.2.0.0/16")
	masqAll := &v1alpha1.ProxySettings{ClusterCIDRs: []v1alpha1.CIDR{"10.1.0.0/16"}, IPTables: &v1alpha1.IPTablesSettings{MasqueradeAll: true}}
	spec := v1alpha1.ProxySettings{ClusterCIDRs: []v1alpha1.CIDR{"10.2.0.0/16"}, NFTables: &v1alpha1.NFTablesSettings{}}
	for _, tc := range []struct {
		name string
		// status is what the previous agent reported for generation 2.
		phase          v1alpha1.NodePhase
		failedGen      int64
		active         v1alpha1.ProxyMode
		activeSettings *v1alpha1.ProxySettings
		// build is the mode whose backend is built, want what it gets.
		build    v1alpha1.ProxyMode
		wantCIDR netip.Prefix
		wantAll  bool
		wantHeld bool
	}{
		{
			name:  "failed reconfiguration: the old settings",
			phase: v1alpha1.NodeFailed, failedGen: 2, active: v1alpha1.ModeNFTables,
			activeSettings: &v1alpha1.ProxySettings{ClusterCIDRs: []v1alpha1.CIDR{"10.1.0.0/16"}},
			build:          v1alpha1.ModeNFTables, wantCIDR: cidrA, wantHeld: true,
		},
		{
			name:  "failed switch: the restored mode's settings, read for it",
			phase: v1alpha1.NodeFailed, failedGen: 2, active: v1alpha1.ModeIPTables, activeSettings: masqAll,
			build: v1alpha1.ModeIPTables, wantCIDR: cidrA, wantAll: true, wantHeld: true,
		},
		{
			name:  "status of an agent that did not report them: the spec's",
			phase: v1alpha1.NodeFailed, failedGen: 2, active: v1alpha1.ModeNFTables,
			build: v1alpha1.ModeNFTables, wantCIDR: cidrB, wantHeld: true,
		},
		{
			name:  "failure of an earlier spec: the spec's",
			phase: v1alpha1.NodeFailed, failedGen: 1, active: v1alpha1.ModeNFTables, activeSettings: masqAll,
			build: v1alpha1.ModeNFTables, wantCIDR: cidrB,
		},
		{
			name:  "active, the spec changed while no agent ran: what served first",
			phase: v1alpha1.NodeActive, active: v1alpha1.ModeNFTables, activeSettings: masqAll,
			build: v1alpha1.ModeNFTables, wantCIDR: cidrA,
		},
		{
			name:  "active with the spec's settings: the spec's",
			phase: v1alpha1.NodeActive, active: v1alpha1.ModeNFTables, activeSettings: spec.DeepCopy(),
			build: v1alpha1.ModeNFTables, wantCIDR: cidrB,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pn := &v1alpha1.ProxyNode{
				ObjectMeta: metav1.ObjectMeta{Name: "n", Generation: 2},
				Spec:       v1alpha1.ProxyNodeSpec{DesiredMode: v1alpha1.ModeNFTables, Settings: *spec.DeepCopy()},
				Status:     v1alpha1.ProxyNodeStatus{Phase: tc.phase, ActiveMode: tc.active, ActiveSettings: tc.activeSettings},
			}
			if tc.phase == v1alpha1.NodeFailed {
				meta.SetStatusCondition(&pn.Status.Conditions, metav1.Condition{
					Type: contract.ConditionDegraded, Status: metav1.ConditionTrue, Reason: contract.ReasonVerificationFailed, ObservedGeneration: tc.failedGen,
				})
			}
			var built []dataplane.NodeConfig
			factory := func(cfg dataplane.NodeConfig, _ v1alpha1.ProxySettings) (dataplane.Backend, error) {
				built = append(built, cfg)
				return nil, nil
			}
			store := cache.NewStore(cache.MetaNamespaceKeyFunc)
			if err := store.Add(pn); err != nil {
				t.Fatal(err)
			}
			a := &agentState{
				opts: Options{NodeName: "n", Backends: map[v1alpha1.ProxyMode]backends.Factory{
					v1alpha1.ModeNFTables: factory, v1alpha1.ModeIPTables: factory,
				}},
				nodeLister: corelisters.NewNodeLister(cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})),
				pnStore:    store,
				tracker:    model.NewTracker("n", nil),
			}
			a.readPrevious(pn)
			if err := a.resolve(); err != nil {
				t.Fatal(err)
			}
			if _, _, err := a.backend(tc.build); err != nil {
				t.Fatal(err)
			}
			d := a.current().desire
			if got := built[0]; !slices.Equal(got.ClusterCIDRs, []netip.Prefix{tc.wantCIDR}) || got.MasqueradeAll != tc.wantAll || d.Held != tc.wantHeld {
				t.Errorf("%s built with clusterCIDRs %v, masqueradeAll %v (held %v); want %v, %v (held %v)", tc.build, got.ClusterCIDRs, got.MasqueradeAll, d.Held, tc.wantCIDR, tc.wantAll, tc.wantHeld)
			}
			if d.Mode != v1alpha1.ModeNFTables {
				t.Errorf("desired mode %s, want the spec's nftables", d.Mode)
			}

			// The spec changes (or, for a spec changed while no agent
			// ran, the agent resolves again once it runs): its settings.
			pn = pn.DeepCopy()
			pn.Generation = 3
			if err := store.Update(pn); err != nil {
				t.Fatal(err)
			}
			if err := a.resolve(); err != nil {
				t.Fatal(err)
			}
			if _, _, err := a.backend(tc.build); err != nil {
				t.Fatal(err)
			}
			if got := built[1]; !slices.Equal(got.ClusterCIDRs, []netip.Prefix{cidrB}) || a.current().desire.Held {
				t.Errorf("after the spec changed, %s built with clusterCIDRs %v (held %v); want the spec's %v", tc.build, got.ClusterCIDRs, a.current().desire.Held, cidrB)
			}
		})
	}
}
