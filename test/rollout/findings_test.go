package rollout

import (
	"maps"
	"slices"
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

// TestFindingsFromRealServices: three nodes served by kube-proxy in
// iptables mode, Services the API server gave node ports and a
// health-check node port. A paused ProxyConfig moving the nodes to
// nftables shows status.findings from the real Services: the Warning
// for NodePorts on 127.0.0.1 and the Info on leaving kube-proxy, and
// nothing about the health-check node port, which the agent serves in
// kube-proxy's place. No finding is Critical, so nothing asks for
// acknowledgement: resumed, the rollout completes and the findings go.
func TestFindingsFromRealServices(t *testing.T) {
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
	pc := newConfig("pc", v1alpha1.ModeNFTables, intstr.FromInt32(2))
	pc.Spec.Rollout.Paused = true
	w.create(pc)

	want := map[string][]string{
		findings.CodeLocalhostNodePortsNotServed: {"default/front", "default/web"},
		findings.CodeLeavingKubeProxy:            {"node/node-00", "node/node-01", "node/node-02"},
	}
	// The findings name a node once its agent has reported: wait for all
	// three (they report at their own pace).
	w.waitFor("the findings of all three nodes", 30*time.Second, func() bool {
		f, ok := finding(w.config("pc"), findings.CodeLeavingKubeProxy)
		return ok && len(f.Objects) == 3
	})
	c := w.config("pc")
	if len(c.Status.Findings) != len(want) {
		t.Errorf("findings %+v, want only %v", c.Status.Findings, slices.Sorted(maps.Keys(want)))
	}
	for code, objs := range want {
		if f, ok := finding(c, code); !ok || !slices.Equal(f.Objects, objs) {
			t.Errorf("%s: found %v, objects %v; want objects %v", code, ok, f.Objects, objs)
		}
	}
	for _, f := range c.Status.Findings {
		if f.Severity == v1alpha1.SeverityCritical {
			t.Errorf("Critical finding %+v", f)
		}
	}
	if got := w.rec.specChanges(); len(got) != 0 {
		t.Fatalf("nodes moved while the rollout was paused: %v", got)
	}

	w.edit("pc", func(c *v1alpha1.ProxyConfig) { c.Spec.Rollout.Paused = false })
	c = w.waitPhase("pc", v1alpha1.RolloutCompleted, 60*time.Second)
	if got := w.rec.specChanges(); len(got) != 3 {
		t.Errorf("spec changes %v, want the three nodes moved", got)
	}
	if len(c.Status.Findings) != 0 {
		t.Errorf("findings %+v once every node moved, want none", c.Status.Findings)
	}
	if p := cond(c, v1alpha1.ConditionProgressing); p.Reason == plan.ReasonAcknowledgementRequired {
		t.Errorf("Progressing %+v asks for acknowledgement with no Critical finding", p)
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
