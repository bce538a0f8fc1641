package rollout

import (
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
	"github.com/proxyshift/proxyshift/controllers/findings"
	"github.com/proxyshift/proxyshift/controllers/plan"
)

// TestFindingsHoldUntilAcknowledged: three nodes served by kube-proxy in
// iptables mode, Services the API server gave node ports and a
// health-check node port. A ProxyConfig moving the nodes to nftables
// shows status.findings from the real Services, holds in Preflight on the
// Critical one, follows a Service created meanwhile, moves no node until
// the code is acknowledged, then completes.
func TestFindingsHoldUntilAcknowledged(t *testing.T) {
	w := newWorld(t)
	kp := allFacts()
	for _, n := range []string{"node-00", "node-01", "node-02"} {
		w.agents.set(n, behavior{facts: kp, initial: v1alpha1.ModeKubeProxy, kubeProxyMode: v1alpha1.ModeIPTables, delay: 300 * time.Millisecond})
	}
	nodes := w.createNodes("node", 3, pool)
	w.rec.track("pc", nodes, 2)
	w.create(kubeProxyDaemonSet())
	w.create(service("web", corev1.ServiceTypeNodePort, corev1.ServiceExternalTrafficPolicyCluster))
	w.create(service("front", corev1.ServiceTypeLoadBalancer, corev1.ServiceExternalTrafficPolicyLocal))
	w.startOperator(opOptions{})
	w.create(newConfig("pc", v1alpha1.ModeNFTables, intstr.FromInt32(2)))

	w.waitFor("the rollout to hold for acknowledgement", 30*time.Second, func() bool {
		return cond(w.config("pc"), v1alpha1.ConditionProgressing).Reason == plan.ReasonAcknowledgementRequired
	})
	c := w.config("pc")
	if c.Status.Phase != v1alpha1.RolloutPreflight {
		t.Errorf("phase %s, want Preflight", c.Status.Phase)
	}
	if p := cond(c, v1alpha1.ConditionProgressing); !strings.Contains(p.Message, findings.CodeHealthCheckNodePortNotServed+" (1: default/front)") {
		t.Errorf("Progressing message %q does not name the finding and its Service", p.Message)
	}
	want := map[string][]string{
		findings.CodeHealthCheckNodePortNotServed: {"default/front"},
		findings.CodeLocalhostNodePortsNotServed:  {"default/front", "default/web"},
		findings.CodeKubeProxyHealthzNotServed:    nil, // front is Local, web is no LoadBalancer
		findings.CodeLeavingKubeProxy:             {"node/node-00", "node/node-01", "node/node-02"},
	}
	for code, objs := range want {
		f, ok := finding(c, code)
		if ok != (objs != nil) || (ok && !slices.Equal(f.Objects, objs)) {
			t.Errorf("%s: found %v, objects %v; want objects %v", code, ok, f.Objects, objs)
		}
	}
	if f := c.Status.Findings; len(f) == 0 || f[0].Severity != v1alpha1.SeverityCritical {
		t.Errorf("findings %+v, want the Critical one first", f)
	}
	w.waitEvent("pc", plan.EventAcknowledgementRequired)

	// A Service created while the rollout holds shows up in the findings.
	w.create(service("late", corev1.ServiceTypeLoadBalancer, corev1.ServiceExternalTrafficPolicyLocal))
	w.waitFor("the new Service in the findings", 15*time.Second, func() bool {
		f, _ := finding(w.config("pc"), findings.CodeHealthCheckNodePortNotServed)
		return f.Count == 2 && slices.Equal(f.Objects, []string{"default/front", "default/late"})
	})
	if got := w.rec.specChanges(); len(got) != 0 {
		t.Fatalf("nodes moved before the finding was acknowledged: %v", got)
	}

	w.edit("pc", func(c *v1alpha1.ProxyConfig) {
		c.Spec.Rollout.AcknowledgedFindings = []string{findings.CodeHealthCheckNodePortNotServed}
	})
	c = w.waitPhase("pc", v1alpha1.RolloutCompleted, 60*time.Second)
	if got := w.rec.specChanges(); len(got) != 3 {
		t.Errorf("spec changes %v, want the three nodes moved", got)
	}
	if len(c.Status.Findings) != 0 {
		t.Errorf("findings %+v once every node moved, want none", c.Status.Findings)
	}
	w.rec.check(t)
}

func finding(c *v1alpha1.ProxyConfig, code string) (v1alpha1.Finding, bool) {
	for _, f := range c.Status.Findings {
		if f.Code == code {
			return f, true
		}
	}
	return v1alpha1.Finding{}, false
}

// service is a Service default/name of the type and external traffic
// policy; the API server allocates its cluster IP and node ports (and,
// for LoadBalancer with policy Local, its health-check node port).
func service(name string, typ corev1.ServiceType, policy corev1.ServiceExternalTrafficPolicy) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec: corev1.ServiceSpec{Type: typ, ExternalTrafficPolicy: policy, Selector: map[string]string{"app": name},
			Ports: []corev1.ServicePort{{Port: 80, Protocol: corev1.ProtocolTCP}}},
	}
}

// kubeProxyDaemonSet is kube-system/kube-proxy, which the operator needs
// to find before it takes nodes over from kube-proxy.
func kubeProxyDaemonSet() *appsv1.DaemonSet {
	lbl := map[string]string{"k8s-app": "kube-proxy"}
	return &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "kube-proxy"},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: lbl},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: lbl},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "kube-proxy", Image: "registry.k8s.io/kube-proxy"}}},
			},
		},
	}
}
