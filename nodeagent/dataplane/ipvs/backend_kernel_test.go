package ipvs

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	libipvs "github.com/moby/ipvs"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"

	"github.com/proxyshift/proxyshift/api/contract"
	"github.com/proxyshift/proxyshift/api/v1alpha1"
	"github.com/proxyshift/proxyshift/nodeagent/dataplane"
	dt "github.com/proxyshift/proxyshift/nodeagent/dataplane/dataplanetest"
	"github.com/proxyshift/proxyshift/nodeagent/dataplane/internal/nft"
	"github.com/proxyshift/proxyshift/nodeagent/model"
	"github.com/proxyshift/proxyshift/test/netlab"
	"github.com/proxyshift/proxyshift/test/vm"
)

// The kernel tests need IPVS, so they run in the test VM only (make
// test-vm) and skip elsewhere. Each builds a netlab lab (a node namespace
// routing between clients and pods), programs the node through the
// backend, sends real connections through it, and reads the kernel back
// through moby/ipvs directly, never through the backend's memory.

const okTimeout = 2 * time.Second

// labConfig is the lab node's configuration.
var labConfig = dataplane.NodeConfig{
	NodeName:      "node-1",
	NodeIPs:       []netip.Addr{netlab.NodeIP},
	ClusterCIDRs:  []netip.Prefix{netlab.PodCIDR},
	MasqueradeBit: 14,
}

// loadVMModules loads what the kernel tests use, in the VM; elsewhere it
// skips the test, naming the missing feature.
func loadVMModules(t testing.TB) {
	t.Helper()
	vm.Require(t, "IPVS (the ip_vs kernel module)")
	mods, err := contract.ModulesFor(v1alpha1.ModeIPVS, "")
	if err != nil {
		t.Fatal(err)
	}
	// The schedulers the tests use (the foreign virtual services' lc
	// too), and the lab's bridges and veth pairs.
	vm.LoadModules(t, append(mods, "ip_vs_wrr", "ip_vs_sh", "ip_vs_lc", "bridge", "veth")...)
}

// newLab builds the lab with n pods, named pod-a, pod-b, ...
func newLab(t *testing.T, n int) (*netlab.Lab, []*netlab.Pod) {
	t.Helper()
	loadVMModules(t)
	lab := netlab.NewLab(t)
	var pods []*netlab.Pod
	for i := range n {
		pods = append(pods, lab.Node.AddPod(t, fmt.Sprintf("pod-%c", 'a'+i)))
	}
	return lab, pods
}

func newLabBackend(t *testing.T, lab *netlab.Lab, opts ...Option) *Backend {
	t.Helper()
	b, err := New(labConfig, append([]Option{WithNetNS(lab.Node.NS.NS())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// labService is a TCP service port at ip:80 with the pods as endpoints.
func labService(name, ip string, pods ...*netlab.Pod) *model.ServicePort {
	sp := dt.Svc("lab", name, "p", ip, 80)
	for _, p := range pods {
		sp.Endpoints = append(sp.Endpoints, model.Endpoint{IP: p.IP, Port: netlab.ServerPort, Ready: true, Serving: true, IsLocal: true})
	}
	return sp
}

func snapshotOf(sps ...*model.ServicePort) *model.Snapshot {
	return &model.Snapshot{Ports: map[corev1.IPFamily]map[model.ServicePortName]*model.ServicePort{corev1.IPv4Protocol: dt.PortsOf(sps...)}}
}

func mustSync(t *testing.T, b *Backend, req dataplane.SyncRequest) dataplane.Counts {
	t.Helper()
	c, err := b.Sync(context.Background(), req)
	if err != nil {
		t.Fatalf("sync: %v", err)
	}
	return c
}

// rawHandle opens moby/ipvs in the lab node, for the test's own reads
// and for other programs' virtual services.
func rawHandle(t *testing.T, lab *netlab.Lab) *libipvs.Handle {
	t.Helper()
	h, err := libipvs.New(fmt.Sprintf("/proc/self/fd/%d", lab.Node.NS.FD()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	return h
}

// dumpIPVS renders every virtual service the kernel holds, with its real
// servers, sorted.
func dumpIPVS(t *testing.T, h *libipvs.Handle) string {
	t.Helper()
	services, err := h.GetServices()
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, s := range services {
		line := fmt.Sprintf("fwmark %d sched %s", s.FWMark, s.SchedName)
		if s.FWMark == 0 {
			a, _ := netip.AddrFromSlice(s.Address)
			line = fmt.Sprintf("%s/%s sched %s flags %d timeout %d", nft.ProtoName(uint8(s.Protocol)),
				netip.AddrPortFrom(a.Unmap(), s.Port), s.SchedName, s.Flags&^svcFlagHashed, s.Timeout)
		}
		dests, err := h.GetDestinations(s)
		if err != nil {
			t.Fatal(err)
		}
		var ds []string
		for _, d := range dests {
			a, _ := netip.AddrFromSlice(d.Address)
			ds = append(ds, fmt.Sprintf("%s weight %d", netip.AddrPortFrom(a.Unmap(), d.Port), d.Weight))
		}
		sort.Strings(ds)
		lines = append(lines, line+" -> ["+strings.Join(ds, ", ")+"]")
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

func vip(ip string) netip.AddrPort { return netip.AddrPortFrom(netip.MustParseAddr(ip), 80) }

// TestVMWeightedRoundRobin checks that the weights the backend programs
// are those wrr balances by: weights 1 and 3 give a quarter and three
// quarters of new connections. (The model's endpoints all weigh 1; the
// test sets the weights through the backend's own programming path.)
func TestVMWeightedRoundRobin(t *testing.T) {
	lab, pods := newLab(t, 2)
	b := newLabBackend(t, lab, WithScheduler("wrr"))
	sp := labService("weighted", "198.19.0.20", pods...)
	mustSync(t, b, dataplane.SyncRequest{Model: snapshotOf(sp), Full: true})

	kn, err := b.open()
	if err != nil {
		t.Fatal(err)
	}
	defer kn.close()
	a, bb := netip.AddrPortFrom(pods[0].IP, netlab.ServerPort), netip.AddrPortFrom(pods[1].IP, netlab.ServerPort)
	vs := &virtualService{key: vsKey{addr: sp.ClusterIP, proto: unix.IPPROTO_TCP, port: 80}, scheduler: "wrr",
		dests: map[netip.AddrPort]int{a: 1, bb: 3}}
	if err := kn.applyIPVS(ipv4, nil, []serviceUpdate{{want: vs, set: []netip.AddrPort{a, bb}}}); err != nil {
		t.Fatal(err)
	}
	h := rawHandle(t, lab)
	if got, want := dumpIPVS(t, h), "tcp/198.19.0.20:80 sched wrr flags 0 timeout 0 -> [198.18.1.2:8080 weight 1, 198.18.1.3:8080 weight 3]"; got != want {
		t.Fatalf("kernel holds\n%s\nwant\n%s", got, want)
	}
	const n = 40
	tally := lab.Client.NS.Spread(netlab.TCP, vip("198.19.0.20"), n, okTimeout)
	if tally.Answered() != n {
		t.Fatalf("%d connections: %v; want all answered", n, tally)
	}
	// wrr interleaves exactly; allow a few either way.
	if got := tally.Answers["pod-a"]; got < n/4-3 || got > n/4+3 {
		t.Errorf("%d connections with weights 1 and 3: %v; want about %d and %d", n, tally, n/4, 3*n/4)
	}
}

// TestVMSourceHashing checks the sh scheduler: each client always lands
// on the same endpoint.
func TestVMSourceHashing(t *testing.T) {
	lab, pods := newLab(t, 3)
	b := newLabBackend(t, lab, WithScheduler("sh"))
	mustSync(t, b, dataplane.SyncRequest{Model: snapshotOf(labService("hashed", "198.19.0.21", pods...)), Full: true})
	if got := dumpIPVS(t, rawHandle(t, lab)); !strings.Contains(got, "sched sh") {
		t.Fatalf("kernel holds\n%s\nwant the sh scheduler", got)
	}
	for _, client := range []*netlab.Host{lab.Client, lab.OtherClient} {
		tally := client.NS.Spread(netlab.TCP, vip("198.19.0.21"), 15, okTimeout)
		if tally.Answered() != 15 || len(tally.Answers) != 1 {
			t.Errorf("client %s: %v; want every connection answered by one pod", client.IP, tally)
		}
	}
}

// foreignServices are virtual services another program created in the
// node before the agent started: on the node's own address, on an address
// of no interface, one keyed by firewall mark, and one exactly where a
// service's node port goes.
func foreignServices(t *testing.T, h *libipvs.Handle) {
	t.Helper()
	service := func(proto uint16, addr string, port uint16, sched string) *libipvs.Service {
		return &libipvs.Service{AddressFamily: unix.AF_INET, Protocol: proto, Address: net.ParseIP(addr).To4(), Port: port,
			SchedName: sched, Netmask: 0xffffffff}
	}
	for _, s := range []struct {
		svc   *libipvs.Service
		dests []string
	}{
		{service(unix.IPPROTO_TCP, netlab.NodeIP.String(), 9999, "lc"), []string{"198.18.1.200"}},
		{service(unix.IPPROTO_UDP, "10.99.0.1", 53, "rr"), nil},
		{&libipvs.Service{AddressFamily: unix.AF_INET, FWMark: 7, SchedName: "rr", Netmask: 0xffffffff}, []string{"198.18.1.201"}},
		{service(unix.IPPROTO_TCP, netlab.NodeIP.String(), 30090, "lc"), []string{"198.18.1.202"}},
	} {
		if err := h.NewService(s.svc); err != nil {
			t.Fatalf("create foreign virtual service: %v", err)
		}
		for _, d := range s.dests {
			if err := h.NewDestination(s.svc, &libipvs.Destination{AddressFamily: unix.AF_INET, Address: net.ParseIP(d).To4(), Port: 80, Weight: 5}); err != nil {
				t.Fatal(err)
			}
		}
	}
}

const foreignDump = `fwmark 7 sched rr -> [198.18.1.201:80 weight 5]
tcp/198.18.0.1:30090 sched lc flags 0 timeout 0 -> [198.18.1.202:80 weight 5]
tcp/198.18.0.1:9999 sched lc flags 0 timeout 0 -> [198.18.1.200:80 weight 5]
udp/10.99.0.1:53 sched rr flags 0 timeout 0 -> []`

// foreignOnly returns the lines of dump that are not the backend's (by
// the addresses the test's services use).
func foreignOnly(dump string) string {
	var out []string
	for _, l := range strings.Split(dump, "\n") {
		if !strings.Contains(l, "198.19.") && !strings.Contains(l, ":30080 ") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestVMForeignVirtualServicesSurvive checks that the backend leaves
// other programs' virtual services alone through syncs, full resyncs, an
// agent restart and Cleanup, reports the one in its way as a conflict,
// and after a restart still recognises (and deletes) a NodePort virtual
// service of its own on the node's address.
func TestVMForeignVirtualServicesSurvive(t *testing.T) {
	lab, pods := newLab(t, 2)
	h := rawHandle(t, lab)
	foreignServices(t, h)

	np := labService("np", "198.19.0.30", pods...)
	np.NodePort = 30080
	blocked := labService("blocked", "198.19.0.31", pods...)
	blocked.NodePort = 30090
	m := snapshotOf(np, blocked)

	b := newLabBackend(t, lab)
	check := func(step string) {
		t.Helper()
		if got := foreignOnly(dumpIPVS(t, h)); got != foreignDump {
			t.Errorf("after %s, the foreign virtual services are\n%s\nwant\n%s", step, got, foreignDump)
		}
	}
	expectConflict := func(step string, err error) {
		t.Helper()
		var ce *ConflictError
		if !errors.As(err, &ce) || !slices.Equal(ce.Keys, []string{"tcp/198.18.0.1:30090"}) {
			t.Errorf("%s: %v; want a conflict on tcp/198.18.0.1:30090 only", step, err)
		}
		// A warning, not a failed sync: nothing else went wrong.
		if ws, rest := dataplane.SplitWarnings(err); len(ws) != 1 || rest != nil || !strings.Contains(err.Error(), "tcp/198.18.0.1:30090") {
			t.Errorf("%s: %v is not a warning naming tcp/198.18.0.1:30090 alone (warnings %v, rest %v)", step, err, ws, rest)
		}
	}

	present := func(step string, want bool) {
		t.Helper()
		if got, err := b.Present(context.Background()); err != nil || got != want {
			t.Errorf("%s: Present says %v, %v; want %v", step, got, err, want)
		}
	}
	present("before the first sync", false)
	_, err := b.Sync(context.Background(), dataplane.SyncRequest{Model: m, Full: true})
	expectConflict("first sync", err)
	present("after the first sync", true)
	check("the first sync")
	if tally := lab.Client.NS.Spread(netlab.TCP, netip.AddrPortFrom(netlab.NodeIP, 30080), 10, okTimeout); tally.Answered() != 10 {
		t.Errorf("node port 30080: %v; want every connection answered", tally)
	}

	np.Endpoints = np.Endpoints[:1]
	_, err = b.Sync(context.Background(), dataplane.SyncRequest{Model: m, Changed: model.ChangeSet{np.Name: {}}})
	if err != nil {
		t.Errorf("incremental sync: %v", err)
	}
	check("an incremental sync")
	_, err = b.Sync(context.Background(), dataplane.SyncRequest{Model: m, Full: true})
	expectConflict("full resync", err)
	check("a full resync")

	// The agent restarts and np is gone meanwhile: its virtual services
	// are found by their records, the one on the node address too.
	b = newLabBackend(t, lab)
	_, err = b.Sync(context.Background(), dataplane.SyncRequest{Model: snapshotOf(blocked), Full: true})
	expectConflict("sync after a restart", err)
	check("the sync after a restart")
	if got := dumpIPVS(t, h); strings.Contains(got, "198.19.0.30") || strings.Contains(got, ":30080 ") {
		t.Errorf("np's virtual services outlived its deletion:\n%s", got)
	}

	removed, err := b.Cleanup(context.Background())
	if err != nil {
		t.Errorf("cleanup: %v", err)
	}
	t.Logf("cleanup removed %q", removed)
	if got := dumpIPVS(t, h); got != foreignDump {
		t.Errorf("after cleanup the kernel holds\n%s\nwant only the foreign virtual services\n%s", got, foreignDump)
	}
	present("after cleanup", false)
}

// recorder logs the IPVS calls that change the kernel.
type recorder struct {
	ipvsHandle
	mu    *sync.Mutex
	calls *[]string
}

func (r recorder) log(call string, s *libipvs.Service, d *libipvs.Destination) {
	r.mu.Lock()
	defer r.mu.Unlock()
	k, _ := serviceKey(s)
	line := call + " " + k.String()
	if d != nil {
		a, _ := netip.AddrFromSlice(d.Address)
		line += fmt.Sprintf(" %s weight %d", netip.AddrPortFrom(a.Unmap(), d.Port), d.Weight)
	}
	*r.calls = append(*r.calls, line)
}

func (r recorder) NewService(s *libipvs.Service) error {
	r.log("NewService", s, nil)
	return r.ipvsHandle.NewService(s)
}

func (r recorder) UpdateService(s *libipvs.Service) error {
	r.log("UpdateService", s, nil)
	return r.ipvsHandle.UpdateService(s)
}

func (r recorder) DelService(s *libipvs.Service) error {
	r.log("DelService", s, nil)
	return r.ipvsHandle.DelService(s)
}

func (r recorder) NewDestination(s *libipvs.Service, d *libipvs.Destination) error {
	r.log("NewDestination", s, d)
	return r.ipvsHandle.NewDestination(s, d)
}

func (r recorder) UpdateDestination(s *libipvs.Service, d *libipvs.Destination) error {
	r.log("UpdateDestination", s, d)
	return r.ipvsHandle.UpdateDestination(s, d)
}

func (r recorder) DelDestination(s *libipvs.Service, d *libipvs.Destination) error {
	r.log("DelDestination", s, d)
	return r.ipvsHandle.DelDestination(s, d)
}

// record makes b log its IPVS writes into the returned slice.
func record(b *Backend) (calls func() []string, reset func()) {
	var mu sync.Mutex
	var log []string
	open := b.openIPVS
	b.openIPVS = func() (ipvsHandle, error) {
		h, err := open()
		if err != nil {
			return nil, err
		}
		return recorder{ipvsHandle: h, mu: &mu, calls: &log}, nil
	}
	return func() []string {
			mu.Lock()
			defer mu.Unlock()
			return slices.Clone(log)
		}, func() {
			mu.Lock()
			defer mu.Unlock()
			log = nil
		}
}

// TestVMIncrementalTouchesOnlyChanged checks that an incremental sync
// makes exactly the IPVS calls of the changed endpoint, that an
// established connection through an unchanged service carries on, and
// that what Sync reports is what Programmed reads back.
func TestVMIncrementalTouchesOnlyChanged(t *testing.T) {
	lab, pods := newLab(t, 3)
	b := newLabBackend(t, lab)
	calls, reset := record(b)
	web := labService("web", "198.19.0.40", pods...)
	web.NodePort = 30080
	churn := labService("churn", "198.19.0.41", pods...)
	m := snapshotOf(web, churn)
	counts := mustSync(t, b, dataplane.SyncRequest{Model: m, Full: true})
	if got, err := b.Programmed(context.Background()); err != nil || got != counts {
		t.Errorf("Programmed reads %+v, %v; the sync reported %+v", got, err, counts)
	}

	session, err := lab.Client.NS.OpenSession(vip("198.19.0.40"), okTimeout)
	if err != nil {
		t.Fatal(err)
	}
	defer session.Close()

	// An unchanged full resync writes nothing.
	reset()
	mustSync(t, b, dataplane.SyncRequest{Model: m, Full: true})
	if got := calls(); len(got) > 0 {
		t.Errorf("a full resync of an unchanged kernel made IPVS calls: %q", got)
	}

	reset()
	churn.Endpoints = churn.Endpoints[:2]
	counts = mustSync(t, b, dataplane.SyncRequest{Model: m, Changed: model.ChangeSet{churn.Name: {}}})
	want := []string{fmt.Sprintf("DelDestination tcp/198.19.0.41:80 %s:%d weight 0", pods[2].IP, netlab.ServerPort)}
	if got := calls(); !slices.Equal(got, want) {
		t.Errorf("incremental sync made IPVS calls %q; want %q", got, want)
	}
	if got, err := b.Programmed(context.Background()); err != nil || got != counts {
		t.Errorf("Programmed reads %+v, %v; the sync reported %+v", got, err, counts)
	}
	if err := session.Exchange("still-there", okTimeout); err != nil {
		t.Errorf("connection through the unchanged service: %v", err)
	}
	if tally := lab.Client.NS.Spread(netlab.TCP, vip("198.19.0.41"), 20, okTimeout); !slices.Equal(tally.Names(), []string{"pod-a", "pod-b"}) || tally.Answered() != 20 {
		t.Errorf("churn after losing pod-c: %v; want pod-a and pod-b only", tally)
	}
}

// TestVMTerminatingEndpointDrains checks that a terminating endpoint
// keeps its established connections and gets no new ones.
func TestVMTerminatingEndpointDrains(t *testing.T) {
	lab, pods := newLab(t, 2)
	b := newLabBackend(t, lab)
	sp := labService("rollout", "198.19.0.50", pods...)
	m := snapshotOf(sp)
	mustSync(t, b, dataplane.SyncRequest{Model: m, Full: true})
	session, err := lab.Client.NS.OpenSession(vip("198.19.0.50"), okTimeout)
	if err != nil {
		t.Fatal(err)
	}
	defer session.Close()

	draining := slices.IndexFunc(pods, func(p *netlab.Pod) bool { return p.Name == session.Server })
	if draining < 0 {
		t.Fatalf("session answered by %q, not a pod", session.Server)
	}
	sp.Endpoints[draining].Ready, sp.Endpoints[draining].Terminating = false, true
	mustSync(t, b, dataplane.SyncRequest{Model: m, Changed: model.ChangeSet{sp.Name: {}}})
	if got := dumpIPVS(t, rawHandle(t, lab)); !strings.Contains(got, fmt.Sprintf("%s:%d weight 0", pods[draining].IP, netlab.ServerPort)) {
		t.Errorf("kernel holds\n%s\nwant %s with weight 0", got, pods[draining].Name)
	}
	if err := session.Exchange("draining", okTimeout); err != nil {
		t.Errorf("connection to the terminating endpoint: %v", err)
	}
	tally := lab.Client.NS.Spread(netlab.TCP, vip("198.19.0.50"), 10, okTimeout)
	if other := pods[1-draining].Name; tally.Answered() != 10 || !slices.Equal(tally.Names(), []string{other}) {
		t.Errorf("new connections: %v; want all answered by %s", tally, other)
	}
}

// TestKernelRandomModels programs random models (dataplanetest.RandomModel,
// fixed seeds) into fresh namespaces, in the VM: the kernel must take every
// virtual service, real server, address and helper-table rule, Programmed
// must read back what the sync counted, and a second full sync must leave
// the same counts.
func TestKernelRandomModels(t *testing.T) {
	loadVMModules(t) // one skip outside the VM, not one per seed
	for seed := range uint64(10) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			// A plain namespace: the lab's disable IPv6, and the models
			// hold IPv6 services.
			ns := netlab.NewNetNS(t, "ipvs")
			b, err := New(labConfig, WithNetNS(ns.NS()))
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			m := dt.RandomModel(rand.New(rand.NewPCG(seed, 1)), 8)
			synced := mustSync(t, b, dataplane.SyncRequest{Model: m, Full: true})
			if got, err := b.Programmed(ctx); err != nil || got != synced {
				t.Errorf("programmed %+v, %v; the sync said %+v", got, err, synced)
			}
			again := mustSync(t, b, dataplane.SyncRequest{Model: m, Full: true})
			if got, err := b.Programmed(ctx); err != nil || got != again || again != synced {
				t.Errorf("after a second full sync: programmed %+v, %v; the syncs said %+v then %+v", got, err, synced, again)
			}
		})
	}
}
