package ipvs

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/proxyshift/proxyshift/api/contract"
	"github.com/proxyshift/proxyshift/api/v1alpha1"
	"github.com/proxyshift/proxyshift/controllers/preflight"
	"github.com/proxyshift/proxyshift/nodeagent/dataplane"
	"github.com/proxyshift/proxyshift/nodeagent/facts"
	"github.com/proxyshift/proxyshift/nodeagent/model"
	"github.com/proxyshift/proxyshift/test/netlab"
)

// The scheduler tests run one lab per scheduler the API accepts, in the
// test VM: the agent's preflight (facts.Prepare, which loads the
// scheduler's module) and the operator's (preflight.Problems on the facts
// the agent gathers there) must pass, the kernel must hold the virtual
// service with that scheduler, and real connections must be balanced as
// the scheduler's family promises.

// schedulerFamily is how a family of schedulers balances, checked with
// real connections through a service of the lab's pods.
type schedulerFamily struct {
	name       string
	schedulers []string
	// pods is how many pods the service starts with.
	pods  int
	check func(t *testing.T, lab *netlab.Lab, b *Backend, sp *model.ServicePort, pods []*netlab.Pod)
}

var schedulerFamilies = []schedulerFamily{
	{name: "round-robin", schedulers: []string{"rr", "wrr"}, pods: 2, check: checkRoundRobin},
	{name: "least-connection", schedulers: []string{"lc", "wlc", "sed", "nq"}, pods: 1, check: checkLeastConnection},
	{name: "source-hash", schedulers: []string{"sh", "mh"}, pods: 3, check: checkSameClientSamePod},
	{name: "destination-locality", schedulers: []string{"dh", "lblc", "lblcr"}, pods: 3, check: checkSameDestinationSamePod},
}

// TestVMSchedulers checks every scheduler of the API, by family. (Unequal
// weights under wrr are TestVMWeightedRoundRobin's.)
func TestVMSchedulers(t *testing.T) {
	loadVMModules(t)
	var covered []string
	for _, fam := range schedulerFamilies {
		for _, s := range fam.schedulers {
			covered = append(covered, s)
			t.Run(fam.name+"/"+s, func(t *testing.T) {
				lab := netlab.NewLab(t)
				preflightPasses(t, lab, v1alpha1.IPVSScheduler(s))
				var pods []*netlab.Pod
				for _, name := range []string{"pod-a", "pod-b", "pod-c"}[:fam.pods] {
					pods = append(pods, lab.Node.AddPod(t, name))
				}
				b := newLabBackend(t, lab, WithScheduler(s))
				sp := labService("sched-"+s, "198.19.0.60", pods...)
				mustSync(t, b, dataplane.SyncRequest{Model: snapshotOf(sp), Full: true})
				if got := dumpIPVS(t, rawHandle(t, lab)); !strings.Contains(got, "tcp/198.19.0.60:80 sched "+s+" ") {
					t.Fatalf("kernel holds\n%s\nwant tcp/198.19.0.60:80 with the %s scheduler", got, s)
				}
				fam.check(t, lab, b, sp, pods)
			})
		}
	}
	slices.Sort(covered)
	if want := strs(contract.Schedulers); !slices.Equal(covered, slices.Sorted(slices.Values(want))) {
		t.Errorf("the families cover the schedulers %v; the API accepts %v", covered, want)
	}
}

func strs(in []v1alpha1.IPVSScheduler) []string {
	out := make([]string, len(in))
	for i, s := range in {
		out[i] = string(s)
	}
	return out
}

// preflightPasses runs the agent's preflight for ipvs with scheduler s in
// the lab node (loading its module, as the agent does before a switch),
// then the operator's on the facts the agent would report there.
func preflightPasses(t *testing.T, lab *netlab.Lab, s v1alpha1.IPVSScheduler) {
	t.Helper()
	g := &facts.Gatherer{NS: lab.Node.NS.NS()}
	if err := g.Prepare(context.Background(), v1alpha1.ModeIPVS, s); err != nil {
		t.Fatalf("the agent's preflight for ipvs with %s: %v", s, err)
	}
	f := g.Gather(context.Background())
	settings := &v1alpha1.ProxySettings{IPVS: &v1alpha1.IPVSSettings{Scheduler: s}}
	if p := preflight.Problems(v1alpha1.ModeIPVS, settings, &f); len(p) > 0 {
		t.Fatalf("the operator's preflight for ipvs with %s on the facts the agent gathered: %q", s, p)
	}
}

// checkRoundRobin: new connections take the pods in turn (equal weights).
func checkRoundRobin(t *testing.T, lab *netlab.Lab, _ *Backend, _ *model.ServicePort, _ []*netlab.Pod) {
	const n = 20
	tally := lab.Client.NS.Spread(netlab.TCP, vip("198.19.0.60"), n, okTimeout)
	if tally.Answered() != n || tally.Answers["pod-a"] < n/2-1 || tally.Answers["pod-b"] < n/2-1 {
		t.Errorf("%d connections: %v; want about half each", n, tally)
	}
}

// checkLeastConnection: three connections held open on pod-a, then pod-b
// joins; new connections all go to pod-b, the one with fewer active
// connections (round robin would alternate).
func checkLeastConnection(t *testing.T, lab *netlab.Lab, b *Backend, sp *model.ServicePort, _ []*netlab.Pod) {
	var held []*netlab.Session
	for range 3 {
		s, err := lab.Client.NS.OpenSession(vip("198.19.0.60"), okTimeout)
		if err != nil {
			t.Fatalf("hold a connection: %v", err)
		}
		defer s.Close()
		held = append(held, s)
	}
	podB := lab.Node.AddPod(t, "pod-b")
	sp.Endpoints = append(sp.Endpoints, model.Endpoint{IP: podB.IP, Port: netlab.ServerPort, Ready: true, Serving: true, IsLocal: true})
	mustSync(t, b, dataplane.SyncRequest{Model: snapshotOf(sp), Changed: model.ChangeSet{sp.Name: {}}})
	const n = 10
	tally := lab.Client.NS.Spread(netlab.TCP, vip("198.19.0.60"), n, okTimeout)
	if tally.Answered() != n || tally.Answers["pod-b"] != n {
		t.Errorf("%d new connections with 3 held on pod-a: %v; want all on pod-b", n, tally)
	}
	for i, s := range held {
		if s.Server != "pod-a" {
			t.Errorf("held connection %d went to %s, want pod-a (the only pod then)", i, s.Server)
		}
		if err := s.Exchange("held", okTimeout); err != nil {
			t.Errorf("held connection %d: %v", i, err)
		}
	}
}

// checkSameClientSamePod: each client's connections all land on one pod.
func checkSameClientSamePod(t *testing.T, lab *netlab.Lab, _ *Backend, _ *model.ServicePort, _ []*netlab.Pod) {
	const n = 15
	for _, client := range []*netlab.Host{lab.Client, lab.OtherClient} {
		tally := client.NS.Spread(netlab.TCP, vip("198.19.0.60"), n, okTimeout)
		if tally.Answered() != n || len(tally.Answers) != 1 {
			t.Errorf("client %s: %v; want every connection answered by one pod", client.IP, tally)
		}
	}
}

// checkSameDestinationSamePod: every connection to the service address,
// whichever client opens it, lands on one pod.
func checkSameDestinationSamePod(t *testing.T, lab *netlab.Lab, _ *Backend, _ *model.ServicePort, _ []*netlab.Pod) {
	const n = 10
	all := map[string]int{}
	for _, client := range []*netlab.Host{lab.Client, lab.OtherClient} {
		tally := client.NS.Spread(netlab.TCP, vip("198.19.0.60"), n, okTimeout)
		if tally.Answered() != n {
			t.Errorf("client %s: %v; want every connection answered", client.IP, tally)
		}
		for pod, c := range tally.Answers {
			all[pod] += c
		}
	}
	if len(all) != 1 {
		t.Errorf("connections from two clients to one address: %v; want one pod for all", all)
	}
}
