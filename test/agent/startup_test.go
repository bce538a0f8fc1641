package agent_test

import (
	"context"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/proxyshift/proxyshift/api/contract"
	"github.com/proxyshift/proxyshift/api/v1alpha1"
	"github.com/proxyshift/proxyshift/nodeagent/agent"
	"github.com/proxyshift/proxyshift/nodeagent/backends"
	"github.com/proxyshift/proxyshift/test/netlab"
	"github.com/proxyshift/proxyshift/test/testenv"
)

// startWorld is what the start tests share: a test API server, a lab
// node, the Node object and its ProxyNode (desired mode nftables, with
// settings), and a NodePort Service with two pods.
type startWorld struct {
	env          *testenv.Env
	lab          *netlab.Lab
	kube         kubernetes.Interface
	svc          *corev1.Service
	pods         []*netlab.Pod
	metrics, hz  string
	agentStopped chan error
}

const startNode = "lab-node"

func newStartWorld(t *testing.T, settings v1alpha1.ProxySettings) *startWorld {
	t.Helper()
	netlab.RequireRoot(t)
	w := &startWorld{env: testenv.Start(t), lab: netlab.NewLab(t)}
	w.kube = kubernetes.NewForConfigOrDie(w.env.Config)
	ctx := context.Background()
	w.pods = []*netlab.Pod{w.lab.Node.AddPod(t, "web-a"), w.lab.Node.AddPod(t, "web-b")}
	w.svc = createWeb(t, w.kube, startNode, w.pods)
	pn := &v1alpha1.ProxyNode{ObjectMeta: metav1.ObjectMeta{Name: startNode}, Spec: v1alpha1.ProxyNodeSpec{DesiredMode: v1alpha1.ModeNFTables, Settings: settings}}
	if err := w.env.Client.Create(ctx, pn); err != nil {
		t.Fatal(err)
	}
	w.metrics, w.hz = freeAddr(t), freeAddr(t)
	return w
}

// run starts the agent in the test's process with cfg as its identity,
// following its ProxyNode, and records when it returns.
func (w *startWorld) run(t *testing.T, cfg *rest.Config) time.Time {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	w.agentStopped = make(chan error, 1)
	started := time.Now()
	go func() {
		w.agentStopped <- agent.Run(ctx, kubernetes.NewForConfigOrDie(cfg), agent.Options{
			NodeName: startNode,
			Mode:     v1alpha1.ModeNFTables,
			Backends: map[v1alpha1.ProxyMode]backends.Factory{
				v1alpha1.ModeNFTables: backends.Factories(backends.Env{NS: w.lab.Node.NS.NS()})[v1alpha1.ModeNFTables],
			},
			ClusterCIDRs:  []netip.Prefix{w.lab.Node.PodCIDR},
			MasqueradeBit: 14,
			MinSyncPeriod: 100 * time.Millisecond,
			SyncPeriod:    time.Minute,
			MetricsAddr:   w.metrics,
			HealthzAddr:   w.hz,
			NetNS:         w.lab.Node.NS.NS(),
			RESTConfig:    cfg,
			SyncGrace:     time.Second,
		})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-w.agentStopped; err != nil {
			t.Errorf("agent: %v", err)
		}
	})
	return started
}

// running fails the test if the agent has returned.
func (w *startWorld) running(t *testing.T) {
	t.Helper()
	select {
	case err := <-w.agentStopped:
		w.agentStopped <- err
		t.Fatalf("the agent returned: %v", err)
	default:
	}
}

// livezWithin checks that /livez answers 200 within d of started.
func (w *startWorld) livezWithin(t *testing.T, started time.Time, d time.Duration) {
	t.Helper()
	for {
		if code, _ := get("http://" + w.hz + "/livez"); code == http.StatusOK {
			t.Logf("/livez answered %v after the start", time.Since(started).Round(time.Millisecond))
			return
		}
		if time.Since(started) > d {
			t.Fatalf("/livez did not answer within %v of the start", d)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// degraded waits for the ProxyNode's Degraded condition to be status with
// reason (and, when true, a message holding each of msg).
func (w *startWorld) degraded(t *testing.T, status metav1.ConditionStatus, reason string, msg ...string) *metav1.Condition {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	var last *metav1.Condition
	for {
		pn := &v1alpha1.ProxyNode{}
		if err := w.env.Client.Get(context.Background(), client.ObjectKey{Name: startNode}, pn); err != nil {
			t.Fatal(err)
		}
		last = meta.FindStatusCondition(pn.Status.Conditions, contract.ConditionDegraded)
		if last != nil && last.Status == status && (reason == "" || last.Reason == reason) &&
			!slices.ContainsFunc(msg, func(m string) bool { return !strings.Contains(last.Message, m) }) {
			return last
		}
		if time.Now().After(deadline) {
			t.Fatalf("ProxyNode %s Degraded is %+v; want %s %s with %q", startNode, last, status, reason, msg)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// agentRole is config/rbac's generated agent ClusterRole, renamed, with
// keep deciding which rules stay.
func agentRole(t *testing.T, name string, keep func(rbacv1.PolicyRule) bool) *rbacv1.ClusterRole {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "config", "rbac", "agent", "role.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	role := &rbacv1.ClusterRole{}
	if err := yaml.Unmarshal(b, role); err != nil {
		t.Fatal(err)
	}
	role.ObjectMeta = metav1.ObjectMeta{Name: name}
	role.Rules = slices.DeleteFunc(role.Rules, func(r rbacv1.PolicyRule) bool { return !keep(r) })
	return role
}

// TestAgentWaitsForItsListsAndSaysSo starts the agent with an identity
// that may not list Services (config/rbac's agent role less that rule):
// its informers cannot sync. The agent must not exit: /livez answers at
// once, /healthz says what it waits for, and its ProxyNode reports
// Degraded (InformersNotSynced). Once the role is whole again, it
// syncs, programs the Service and is no longer Degraded.
func TestAgentWaitsForItsListsAndSaysSo(t *testing.T) {
	w := newStartWorld(t, v1alpha1.ProxySettings{})
	ctx := context.Background()
	noServices := func(r rbacv1.PolicyRule) bool { return !slices.Contains(r.Resources, "services") }
	role := agentRole(t, "lab-agent", noServices)
	if _, err := w.kube.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := w.kube.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "lab-agent"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "lab-agent"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: "User", Name: "lab-agent"}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cfg := rest.CopyConfig(w.env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "lab-agent"}

	started := w.run(t, cfg)
	w.livezWithin(t, started, time.Second)
	c := w.degraded(t, metav1.ConditionTrue, contract.ReasonNotSynced, "the first list of Services", "keep serving")
	t.Logf("Degraded while the list is denied: %s", c.Message)
	if code, body := get("http://" + w.hz + "/healthz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "Services") {
		t.Errorf("/healthz while the Services list is denied: %d %q; want 503 naming Services", code, body)
	}
	w.running(t)

	role = agentRole(t, "lab-agent", func(rbacv1.PolicyRule) bool { return true })
	if _, err := w.kube.RbacV1().ClusterRoles().Update(ctx, role, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	everyPodAnswers(t, w.lab, netip.AddrPortFrom(netip.MustParseAddr(w.svc.Spec.ClusterIP), 80), w.pods)
	w.degraded(t, metav1.ConditionFalse, "")
	if code, body := get("http://" + w.hz + "/healthz"); code != http.StatusOK {
		t.Errorf("/healthz once synced: %d %q", code, body)
	}
}

// TestAgentWaitsForSettingsThatResolve gives the agent a ProxyNode whose
// settings cannot resolve yet: nodePortAddresses primary while the Node
// has no InternalIP. The agent must not exit (it used to): it reports
// Degraded (SettingsUnresolved) and, once the Node gets its address,
// programs the NodePort on it.
func TestAgentWaitsForSettingsThatResolve(t *testing.T) {
	w := newStartWorld(t, v1alpha1.ProxySettings{NodePortAddresses: []v1alpha1.NodePortAddress{v1alpha1.NodePortAddressPrimary}})
	ctx := context.Background()
	started := w.run(t, w.env.Config)
	w.livezWithin(t, started, time.Second)
	c := w.degraded(t, metav1.ConditionTrue, contract.ReasonSettingsUnresolved, "has no InternalIP", "keep serving")
	t.Logf("Degraded while the settings do not resolve: %s", c.Message)
	w.running(t)

	node, err := w.kube.CoreV1().Nodes().Get(ctx, startNode, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: netlab.NodeIP.String()}}
	if _, err := w.kube.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	everyPodAnswers(t, w.lab, netip.AddrPortFrom(netlab.NodeIP, uint16(w.svc.Spec.Ports[0].NodePort)), w.pods)
	w.degraded(t, metav1.ConditionFalse, "")
}

// TestRefusedAddressIsReported runs the agent under config/rbac's agent
// role with a Service whose externalIP is the web Service's cluster IP:
// the agent must not route it, and must say so in a Warning Event on that
// Service (which its role allows) and in its metrics.
func TestRefusedAddressIsReported(t *testing.T) {
	w := newStartWorld(t, v1alpha1.ProxySettings{})
	ctx := context.Background()
	role := agentRole(t, "lab-agent", func(rbacv1.PolicyRule) bool { return true })
	if _, err := w.kube.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := w.kube.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "lab-agent"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "lab-agent"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: "User", Name: "lab-agent"}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	evil, err := w.kube.CoreV1().Services("default").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "evil"},
		Spec: corev1.ServiceSpec{
			Ports:       []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80}},
			ExternalIPs: []string{w.svc.Spec.ClusterIP},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := rest.CopyConfig(w.env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "lab-agent"}
	w.run(t, cfg)
	everyPodAnswers(t, w.lab, netip.AddrPortFrom(netip.MustParseAddr(w.svc.Spec.ClusterIP), 80), w.pods)

	deadline := time.Now().Add(30 * time.Second)
	for {
		evs, err := w.kube.EventsV1().Events("default").List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		i := slices.IndexFunc(evs.Items, func(e eventsv1.Event) bool {
			return e.Regarding.Name == "evil" && e.Regarding.UID == evil.UID && e.Reason == agent.ReasonExternalAddressRefused
		})
		if i >= 0 {
			e := evs.Items[i]
			if e.Type != corev1.EventTypeWarning || !strings.Contains(e.Note, "node "+startNode) ||
				!strings.Contains(e.Note, "spec.externalIPs "+w.svc.Spec.ClusterIP) || !strings.Contains(e.Note, "the cluster IP of Service default/web") {
				t.Errorf("Event %s %s: %q", e.Type, e.Reason, e.Note)
			}
			t.Logf("Event on default/evil: %s", e.Note)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s Event on default/evil within 30s; events: %+v", agent.ReasonExternalAddressRefused, evs.Items)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if code, body := get("http://" + w.metrics + "/metrics"); code != http.StatusOK || !strings.Contains(body, "proxyshift_refused_external_addresses 1") {
		t.Errorf("/metrics: %d, without proxyshift_refused_external_addresses 1", code)
	}
}
