package switchtest

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	gnft "github.com/google/nftables"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/proxyshift/proxyshift/api/contract"
	"github.com/proxyshift/proxyshift/api/v1alpha1"
	"github.com/proxyshift/proxyshift/nodeagent/nsexec"
	"github.com/proxyshift/proxyshift/nodeagent/report"
	"github.com/proxyshift/proxyshift/test/netlab"
	"github.com/proxyshift/proxyshift/test/testenv"
)

// agentBin is the agent binary TestMain builds.
var agentBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "proxyshift-switch-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	agentBin = filepath.Join(dir, "proxyshift-agent")
	cmd := exec.Command("go", "build", "-o", agentBin, "./cmd/agent")
	cmd.Dir = testenv.RepoRoot()
	if out, err := cmd.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build the agent: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

const nodeName = "lab-node"

// The services every world has: web (TCP, NodePort) and dns (UDP), both
// with pods a and b as endpoints.
var (
	webIP      = netip.MustParseAddr("198.19.0.10")
	dnsIP      = netip.MustParseAddr("198.19.0.53")
	webNodePrt = int32(30080)
)

// world is one test's API server, lab node and agent.
type world struct {
	t    *testing.T
	env  *testenv.Env
	kube kubernetes.Interface
	lab  *netlab.Lab
	pods []*netlab.Pod
	gen  int64

	phasesMu sync.Mutex
	phases   []v1alpha1.NodePhase
}

// newWorld starts an API server and a lab with two pods, creates the
// Node, the ProxyNode asking for mode, and the services.
func newWorld(t *testing.T, mode v1alpha1.ProxyMode) *world {
	t.Helper()
	netlab.RequireRoot(t)
	for _, bin := range []string{"iptables-legacy-save", "iptables-nft-save", "iptables-legacy-restore", "iptables-nft-restore"} {
		if _, err := nsexec.LookPath(bin); err != nil {
			t.Fatalf("needs %s (Debian package iptables): %v", bin, err)
		}
	}
	// Dual-stack, so that a test may create dual-stack Services; the
	// others are single-stack IPv4 with the cluster IPs they name.
	w := &world{t: t, env: testenv.StartDualStack(t), lab: netlab.NewLab(t)}
	w.kube = kubernetes.NewForConfigOrDie(w.env.Config)
	w.pods = []*netlab.Pod{w.lab.Node.AddPod(t, "pod-a"), w.lab.Node.AddPod(t, "pod-b")}
	ctx := context.Background()
	if _, err := w.kube.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pn := &v1alpha1.ProxyNode{ObjectMeta: metav1.ObjectMeta{Name: nodeName}}
	if mode != "" {
		w.gen = 1
		pn.Spec = v1alpha1.ProxyNodeSpec{DesiredMode: mode, ConfigRef: &v1alpha1.ConfigReference{Name: "test", Generation: w.gen}}
	}
	if err := w.env.Client.Create(ctx, pn); err != nil {
		t.Fatal(err)
	}
	w.service("web", corev1.ProtocolTCP, webIP, 80, webNodePrt, w.pods...)
	w.service("dns", corev1.ProtocolUDP, dnsIP, 53, 0, w.pods...)
	w.watchPhases()
	return w
}

// service creates a Service and its EndpointSlice.
func (w *world) service(name string, proto corev1.Protocol, ip netip.Addr, port, nodePort int32, pods ...*netlab.Pod) {
	w.t.Helper()
	ctx := context.Background()
	typ := corev1.ServiceTypeClusterIP
	if nodePort != 0 {
		typ = corev1.ServiceTypeNodePort
	}
	if _, err := w.kube.CoreV1().Services("default").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.ServiceSpec{
			Type: typ, ClusterIP: ip.String(),
			Ports: []corev1.ServicePort{{Name: "p", Protocol: proto, Port: port, NodePort: nodePort, TargetPort: intstr.FromInt32(netlab.ServerPort)}},
		},
	}, metav1.CreateOptions{}); err != nil {
		w.t.Fatal(err)
	}
	if _, err := w.kube.DiscoveryV1().EndpointSlices("default").Create(ctx, slice(name, proto, pods...), metav1.CreateOptions{}); err != nil {
		w.t.Fatal(err)
	}
}

func slice(svc string, proto corev1.Protocol, pods ...*netlab.Pod) *discoveryv1.EndpointSlice {
	ready, node, portName, port := true, nodeName, "p", int32(netlab.ServerPort)
	s := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: svc + "-1", Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &portName, Protocol: &proto, Port: &port}},
	}
	for _, p := range pods {
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{p.IP.String()}, NodeName: &node, Conditions: discoveryv1.EndpointConditions{Ready: &ready}})
	}
	return s
}

// setEndpoints replaces a service's endpoints.
func (w *world) setEndpoints(svc string, proto corev1.Protocol, pods ...*netlab.Pod) {
	w.t.Helper()
	if _, err := w.kube.DiscoveryV1().EndpointSlices("default").Update(context.Background(), slice(svc, proto, pods...), metav1.UpdateOptions{}); err != nil {
		w.t.Fatal(err)
	}
}

// desire writes spec.desiredMode (and a new configRef generation), as
// the operator would.
func (w *world) desire(mode v1alpha1.ProxyMode) int64 {
	w.t.Helper()
	return w.writeSpec(func(s *v1alpha1.ProxyNodeSpec) { s.DesiredMode = mode })
}

// settings writes spec.settings (and a new configRef generation), as the
// operator would.
func (w *world) settings(settings v1alpha1.ProxySettings) int64 {
	w.t.Helper()
	return w.writeSpec(func(s *v1alpha1.ProxyNodeSpec) { s.Settings = settings })
}

// writeSpec changes the ProxyNode's spec with change and gives it a new
// configRef generation, which it returns.
func (w *world) writeSpec(change func(*v1alpha1.ProxyNodeSpec)) int64 {
	w.t.Helper()
	w.gen++
	for i := 0; ; i++ {
		pn := &v1alpha1.ProxyNode{}
		if err := w.env.Client.Get(context.Background(), client.ObjectKey{Name: nodeName}, pn); err != nil {
			w.t.Fatal(err)
		}
		change(&pn.Spec)
		pn.Spec.ConfigRef = &v1alpha1.ConfigReference{Name: "test", Generation: w.gen}
		err := w.env.Client.Update(context.Background(), pn)
		if err == nil {
			return w.gen
		}
		if !apierrors.IsConflict(err) || i > 10 {
			w.t.Fatal(err)
		}
	}
}

func (w *world) proxyNode() *v1alpha1.ProxyNode {
	w.t.Helper()
	pn := &v1alpha1.ProxyNode{}
	if err := w.env.Client.Get(context.Background(), client.ObjectKey{Name: nodeName}, pn); err != nil {
		w.t.Fatal(err)
	}
	return pn
}

// waitStatus polls the ProxyNode until cond holds.
func (w *world) waitStatus(what string, timeout time.Duration, cond func(*v1alpha1.ProxyNode) bool) *v1alpha1.ProxyNode {
	w.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		pn := w.proxyNode()
		if cond(pn) {
			return pn
		}
		if time.Now().After(deadline) {
			w.t.Fatalf("timed out after %s waiting for %s; status: %s", timeout, what, statusText(pn))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitActive waits until the agent reports Active in mode for the
// current config generation, healthy.
func (w *world) waitActive(mode v1alpha1.ProxyMode) *v1alpha1.ProxyNode {
	w.t.Helper()
	gen := w.gen
	return w.waitStatus(fmt.Sprintf("Active in %s for generation %d", mode, gen), 60*time.Second, func(pn *v1alpha1.ProxyNode) bool {
		st := pn.Status
		ready := meta.FindStatusCondition(st.Conditions, contract.ConditionReady)
		return st.Phase == v1alpha1.NodeActive && st.ActiveMode == mode && st.ObservedConfig != nil &&
			st.ObservedConfig.Generation == gen && ready != nil && ready.Status == metav1.ConditionTrue
	})
}

func statusText(pn *v1alpha1.ProxyNode) string {
	st := pn.Status
	var b strings.Builder
	fmt.Fprintf(&b, "phase %s active %s observed %+v", st.Phase, st.ActiveMode, st.ObservedConfig)
	for _, c := range st.Conditions {
		fmt.Fprintf(&b, "; %s=%s %s: %s", c.Type, c.Status, c.Reason, c.Message)
	}
	return b.String()
}

// watchPhases records every phase the ProxyNode's status shows, in order.
func (w *world) watchPhases() {
	c, err := report.NewClient(w.env.Config)
	if err != nil {
		w.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	w.t.Cleanup(cancel)
	lw := c.ListWatch(nodeName)
	wi, err := lw.Watch(metav1.ListOptions{})
	if err != nil {
		w.t.Fatal(err)
	}
	go func() {
		defer wi.Stop()
		var last v1alpha1.NodePhase
		for {
			select {
			case <-ctx.Done():
				return
			case ev, ok := <-wi.ResultChan():
				if !ok {
					return
				}
				if ev.Type == watch.Error {
					continue
				}
				pn, ok := ev.Object.(*v1alpha1.ProxyNode)
				if !ok || pn.Status.Phase == last || pn.Status.Phase == "" {
					continue
				}
				last = pn.Status.Phase
				w.phasesMu.Lock()
				w.phases = append(w.phases, last)
				w.phasesMu.Unlock()
			}
		}
	}()
}

// phasesSince returns the phases seen from index i on, and the next
// index.
func (w *world) phasesSince(i int) ([]v1alpha1.NodePhase, int) {
	w.phasesMu.Lock()
	defer w.phasesMu.Unlock()
	return append([]v1alpha1.NodePhase(nil), w.phases[i:]...), len(w.phases)
}

// agentProc is a running agent binary.
type agentProc struct {
	t    *testing.T
	cmd  *exec.Cmd
	log  *lockedBuffer
	done chan struct{}
	err  error
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// agentArgs are the flags every agent of a world runs with.
func (w *world) agentArgs(extra ...string) []string {
	return append([]string{
		"--kubeconfig", w.env.Kubeconfig, "--node-name", nodeName, "--netns", w.lab.Node.NS.Name,
		"--metrics-bind-address=", "--healthz-bind-address=",
		"--cluster-cidr", netlab.PodCIDR.String(), "--min-sync-period", "100ms", "--sync-period", "1m", "-v=2",
	}, extra...)
}

// startAgent starts the agent binary; it is stopped (SIGTERM) when the
// test ends, and its log is shown if the test failed.
func (w *world) startAgent(extra ...string) *agentProc {
	w.t.Helper()
	a := &agentProc{t: w.t, log: &lockedBuffer{}, done: make(chan struct{})}
	a.cmd = exec.Command(agentBin, w.agentArgs(extra...)...)
	a.cmd.Stdout, a.cmd.Stderr = a.log, a.log
	if err := a.cmd.Start(); err != nil {
		w.t.Fatal(err)
	}
	go func() { a.err = a.cmd.Wait(); close(a.done) }()
	w.t.Cleanup(func() {
		a.stop()
		if w.t.Failed() {
			w.t.Logf("agent %v log:\n%s", extra, a.log.String())
		}
	})
	return a
}

// stop ends the agent with SIGTERM, as a DaemonSet rollout would.
func (a *agentProc) stop() {
	select {
	case <-a.done:
		return
	default:
	}
	_ = a.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-a.done:
	case <-time.After(15 * time.Second):
		_ = a.cmd.Process.Kill()
		<-a.done
	}
}

// kill9 kills the agent at once.
func (a *agentProc) kill9() {
	_ = a.cmd.Process.Kill()
	<-a.done
}

// waitLog waits for a line of the agent's log containing s.
func (a *agentProc) waitLog(s string, timeout time.Duration) {
	a.t.Helper()
	deadline := time.Now().Add(timeout)
	for !strings.Contains(a.log.String(), s) {
		select {
		case <-a.done:
			a.t.Fatalf("agent exited (%v) before logging %q:\n%s", a.err, s, a.log.String())
		default:
		}
		if time.Now().After(deadline) {
			a.t.Fatalf("agent did not log %q within %s:\n%s", s, timeout, a.log.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// ---- traffic ----

func (w *world) clusterIP() netip.AddrPort { return netip.AddrPortFrom(webIP, 80) }
func (w *world) nodePort() netip.AddrPort {
	return netip.AddrPortFrom(netlab.NodeIP, uint16(webNodePrt))
}

// requireTraffic checks that both pods answer through the cluster IP and
// the NodePort, waiting up to 15s for the rules.
func (w *world) requireTraffic() {
	w.t.Helper()
	for _, target := range []netip.AddrPort{w.clusterIP(), w.nodePort()} {
		deadline := time.Now().Add(15 * time.Second)
		for {
			tally := w.lab.Client.NS.Spread(netlab.TCP, target, 20, time.Second)
			if len(tally.Answers) == len(w.pods) && tally.Answered() == 20 {
				break
			}
			if time.Now().After(deadline) {
				w.t.Fatalf("%s: not every pod answered: %v", target, tally)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
}

// startClientLoop opens new connections, one after the other,
// alternately to the cluster IP and the NodePort, until stopped.
func (w *world) startClientLoop() *netlab.ClientLoop {
	return netlab.StartClientLoop(w.t, w.lab.Client.NS, w.clusterIP(), w.nodePort())
}

// ---- what the kernel holds ----

// iptablesSave returns iptables-save of both variants and both families
// in the node namespace, each headed by the command.
func (w *world) iptablesSave() string {
	w.t.Helper()
	ns := w.lab.Node.NS.NS()
	var b strings.Builder
	for _, bin := range []string{"iptables-legacy-save", "iptables-nft-save", "ip6tables-legacy-save", "ip6tables-nft-save"} {
		out, err := ns.Output(context.Background(), nil, bin)
		if err != nil {
			w.t.Fatalf("%s: %v", bin, err)
		}
		fmt.Fprintf(&b, "== %s\n%s", bin, out)
	}
	return b.String()
}

// nftObjects lists the node namespace's nftables tables ("ip nat") and
// the chains of each ("ip nat PROXYSHIFT-SERVICES").
func (w *world) nftObjects() []string {
	w.t.Helper()
	c, err := gnft.New(gnft.WithNetNSFd(w.lab.Node.NS.FD()))
	if err != nil {
		w.t.Fatal(err)
	}
	fams := map[gnft.TableFamily]string{gnft.TableFamilyIPv4: "ip", gnft.TableFamilyIPv6: "ip6", gnft.TableFamilyINet: "inet"}
	var out []string
	for f, name := range fams {
		tables, err := c.ListTablesOfFamily(f)
		if err != nil {
			w.t.Fatal(err)
		}
		for _, t := range tables {
			out = append(out, name+" "+t.Name)
		}
		chains, err := c.ListChainsOfTableFamily(f)
		if err != nil {
			w.t.Fatal(err)
		}
		for _, ch := range chains {
			out = append(out, name+" "+ch.Table.Name+" "+ch.Name)
		}
	}
	return out
}

// holds says whether the kernel holds objects of mode: PROXYSHIFT-
// chains in either iptables variant, or the proxyshift nftables table.
func (w *world) holds(mode v1alpha1.ProxyMode) (bool, string) {
	w.t.Helper()
	switch mode {
	case v1alpha1.ModeIPTables:
		save := w.iptablesSave()
		if strings.Contains(save, "PROXYSHIFT-") {
			return true, save
		}
		// iptables-nft's chains are nftables chains too.
		for _, o := range w.nftObjects() {
			if strings.Contains(o, "PROXYSHIFT-") {
				return true, strings.Join(w.nftObjects(), "\n")
			}
		}
		return false, ""
	case v1alpha1.ModeNFTables:
		for _, o := range w.nftObjects() {
			if o == "ip proxyshift" || o == "ip6 proxyshift" {
				return true, strings.Join(w.nftObjects(), "\n")
			}
		}
		return false, ""
	}
	w.t.Fatalf("holds: mode %s not handled", mode)
	return false, ""
}

// requireOnly fails unless the kernel holds mode's objects and none of
// the other mode's.
func (w *world) requireOnly(mode v1alpha1.ProxyMode) {
	w.t.Helper()
	for _, m := range []v1alpha1.ProxyMode{v1alpha1.ModeIPTables, v1alpha1.ModeNFTables} {
		has, dump := w.holds(m)
		switch {
		case m == mode && !has:
			w.t.Errorf("the kernel holds nothing of %s", m)
		case m != mode && has:
			w.t.Errorf("leftovers of %s after the node went to %s:\n%s", m, mode, dump)
		}
	}
}

// lines returns the lines of s containing sub.
func lines(s, sub string) []string {
	var out []string
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		if strings.Contains(sc.Text(), sub) {
			out = append(out, sc.Text())
		}
	}
	return out
}

func other(m v1alpha1.ProxyMode) v1alpha1.ProxyMode {
	if m == v1alpha1.ModeIPTables {
		return v1alpha1.ModeNFTables
	}
	return v1alpha1.ModeIPTables
}
