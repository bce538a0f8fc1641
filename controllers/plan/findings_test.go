package plan

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
	"github.com/proxyshift/proxyshift/controllers/findings"
)

// takeoverSim is three nodes served by kube-proxy in iptables mode, a
// config moving them to nftables, and a LoadBalancer Service with
// externalTrafficPolicy Local.
func takeoverSim(t *testing.T, mut ...func(*v1alpha1.ProxyConfig)) *sim {
	s := newSim(t, 3, v1alpha1.ModeNFTables, mut...)
	s.kubeProxy = KubeProxy{DaemonSet: "kube-system/kube-proxy", Found: true}
	for _, a := range s.agents {
		a.initial, a.kubeProxyMode = v1alpha1.ModeKubeProxy, v1alpha1.ModeIPTables
	}
	s.services = []*corev1.Service{{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "front"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, ClusterIP: "10.96.0.20", Ports: []corev1.ServicePort{{Port: 80, NodePort: 30080}},
			ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyLocal, HealthCheckNodePort: 32000},
	}}
	return s
}

// criticalCode is the Critical finding withCritical adds.
const criticalCode = "ExampleCritical"

// withCritical makes every pass with nodes to move find, besides what the
// rules find, a Critical difference naming each Service (no rule is
// Critical at present; the hold does not depend on which one is).
func withCritical(t *testing.T) {
	t.Cleanup(func() { computeFindings = findings.Compute })
	computeFindings = func(in findings.Input) []v1alpha1.Finding {
		f := v1alpha1.Finding{Code: criticalCode, Severity: v1alpha1.SeverityCritical, Message: "example", Action: "acknowledge"}
		for _, svc := range in.Services {
			f.Objects = append(f.Objects, svc.Namespace+"/"+svc.Name)
		}
		f.Count = int32(len(f.Objects))
		return append([]v1alpha1.Finding{f}, findings.Compute(in)...)
	}
}

// TestFindingsHoldUntilAcknowledged: a Critical finding holds the rollout
// in Preflight, with status.findings, the Progressing reason and one
// event naming it, and no node changes; acknowledging its code lets the
// rollout run, and the findings go as the nodes move.
func TestFindingsHoldUntilAcknowledged(t *testing.T) {
	withCritical(t)
	s := takeoverSim(t)
	s.steps(20)
	st := s.cfg("pc").Status
	if len(s.specLog) != 0 {
		t.Fatalf("nodes moved before the finding was acknowledged: %v", s.specLog)
	}
	if st.Phase != v1alpha1.RolloutPreflight {
		t.Fatalf("phase %s, want Preflight", st.Phase)
	}
	c := s.cond("pc", v1alpha1.ConditionProgressing)
	if c.Reason != ReasonAcknowledgementRequired || c.Status != metav1.ConditionFalse ||
		!strings.Contains(c.Message, criticalCode+" (1: shop/front)") {
		t.Errorf("Progressing %+v, want False, %s naming the code and the Service", c, ReasonAcknowledgementRequired)
	}
	hc, ok := findingByCode(st.Findings, criticalCode)
	if !ok || hc.Severity != v1alpha1.SeverityCritical || hc.Count != 1 || hc.Objects[0] != "shop/front" {
		t.Errorf("status.findings %+v, want the Critical finding for shop/front", st.Findings)
	}
	if _, ok := findingByCode(st.Findings, findings.CodeLeavingKubeProxy); !ok {
		t.Errorf("status.findings %+v lack the Info finding %s", st.Findings, findings.CodeLeavingKubeProxy)
	}
	if n := countEvents(s.events, EventAcknowledgementRequired); n != 1 {
		t.Errorf("%d %s events, want one", n, EventAcknowledgementRequired)
	}

	s.edit("pc", func(c *v1alpha1.ProxyConfig) {
		c.Spec.Rollout.AcknowledgedFindings = []string{criticalCode}
	})
	s.run(300, s.phaseIs("pc", v1alpha1.RolloutCompleted))
	if len(s.specLog) != 3 {
		t.Errorf("spec writes %v, want the three nodes moved", s.specLog)
	}
	if f := s.cfg("pc").Status.Findings; len(f) != 0 {
		t.Errorf("findings %+v after every node moved, want none left", f)
	}
}

// TestFindingsWarningsDoNotHold: Warning and Info findings are reported
// but the rollout does not wait for them; a LoadBalancer Service with
// externalTrafficPolicy Local, whose health-check node port the agent
// serves in kube-proxy's place, holds nothing.
func TestFindingsWarningsDoNotHold(t *testing.T) {
	s := takeoverSim(t)
	s.steps(3)
	st := s.cfg("pc").Status
	if _, ok := findingByCode(st.Findings, findings.CodeLocalhostNodePortsNotServed); !ok {
		t.Errorf("findings %+v lack the Warning %s", st.Findings, findings.CodeLocalhostNodePortsNotServed)
	}
	s.run(300, s.phaseIs("pc", v1alpha1.RolloutCompleted))
	if s.hasEvent(EventAcknowledgementRequired) {
		t.Error("a rollout with no Critical finding asked for acknowledgement")
	}
}

func findingByCode(fs []v1alpha1.Finding, code string) (v1alpha1.Finding, bool) {
	for _, f := range fs {
		if f.Code == code {
			return f, true
		}
	}
	return v1alpha1.Finding{}, false
}
