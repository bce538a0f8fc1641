package ipvs

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	libipvs "github.com/moby/ipvs"

	dt "github.com/proxyshift/proxyshift/nodeagent/dataplane/dataplanetest"
	"github.com/proxyshift/proxyshift/nodeagent/model"
)

func TestTimeoutsToSet(t *testing.T) {
	kernel := &libipvs.Config{TimeoutTCP: 900 * time.Second, TimeoutTCPFin: 120 * time.Second, TimeoutUDP: 300 * time.Second}
	for _, tc := range []struct {
		name string
		want Timeouts
		set  *libipvs.Config
	}{
		{"nothing asked", Timeouts{}, nil},
		{"what the kernel holds", Timeouts{TCP: 900 * time.Second, UDP: 300 * time.Second}, nil},
		{"one differs", Timeouts{TCP: 900 * time.Second, TCPFin: 30 * time.Second},
			&libipvs.Config{TimeoutTCP: 900 * time.Second, TimeoutTCPFin: 30 * time.Second}},
	} {
		got := timeoutsToSet(kernel, tc.want)
		if (got == nil) != (tc.set == nil) || got != nil && *got != *tc.set {
			t.Errorf("%s: timeoutsToSet = %+v, want %+v", tc.name, got, tc.set)
		}
	}
}

// excludeConfig renders with 198.18.100.0/24 (api's load-balancer IP)
// excluded.
func excludeConfig() *renderConfig {
	rc := testRenderConfig(ipv4, testConfig)
	rc.exclude = []netip.Prefix{netip.MustParsePrefix("198.18.100.0/24")}
	return rc
}

// TestExcludedNotDeletedIncrementally checks that deleting a service
// deletes its virtual services except the one in an excluded CIDR, and
// removes the helper-table elements of both, the record too.
func TestExcludedNotDeletedIncrementally(t *testing.T) {
	base := baseModel()
	next := baseModel()
	api := nameOf("api", next)
	delete(next, api)
	st, _ := newState(excludeConfig(), base, nil)
	changes, _ := changesFor(st, next, model.ChangeSet{api: {}})
	p := incrementalPlan(st, changes)
	if !slices.Equal(p.remove, []vsKey{{addr: netip.MustParseAddr("10.96.0.20"), proto: 6, port: 80}}) {
		t.Errorf("removes %v; want tcp/10.96.0.20:80 only", p.remove)
	}
	if got := describePlan(p); !strings.Contains(got, `post delete virtual-services: 198.18.100.1 . tcp . 80 comment "default/api:http/TCP"`) {
		t.Errorf("the excluded virtual service's record stays:\n%s", got)
	}
}

// TestExcludedNotDeletedByFullSync checks that a full sync leaves a stale
// virtual service of ours in an excluded CIDR in place and stops
// recording it, and deletes the one outside.
func TestExcludedNotDeletedByFullSync(t *testing.T) {
	st, _ := newState(excludeConfig(), baseModel(), nil)
	kv := &kernelView{services: st.services(), addrs: dt.Addrs("10.96.0.10", "10.96.0.20", "10.96.0.53", "198.18.100.1", "198.18.50.5")}
	stale := vsKey{addr: netip.MustParseAddr("10.96.7.7"), proto: 6, port: 443}
	kept := vsKey{addr: netip.MustParseAddr("198.18.100.9"), proto: 6, port: 443}
	kv.services[stale] = &virtualService{key: stale, scheduler: "rr"}
	kv.services[kept] = &virtualService{key: kept, scheduler: "rr"}
	p := fullPlan(st, kv)
	if !slices.Equal(p.remove, []vsKey{stale}) {
		t.Errorf("removes %v; want %v only", p.remove, stale)
	}
	for _, e := range p.elems {
		if e.owner == kept {
			t.Errorf("the new table still records %s: %s", kept, e.id())
		}
	}
}
