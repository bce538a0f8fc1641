package plan

import (
	"testing"

	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
)

func TestMaxUnavailable(t *testing.T) {
	for _, tc := range []struct {
		v        *intstr.IntOrString
		selected int
		want     int
	}{
		{nil, 10, 1},
		{ptr.To(intstr.FromInt32(2)), 10, 2},
		{ptr.To(intstr.FromInt32(20)), 10, 20},
		{ptr.To(intstr.FromString("30%")), 10, 3},
		{ptr.To(intstr.FromString("30%")), 3, 1}, // 0.9 rounds down to 0, then at least 1
		{ptr.To(intstr.FromString("10%")), 1000, 100},
		{ptr.To(intstr.FromString("100%")), 7, 7},
		{ptr.To(intstr.FromString("1%")), 0, 1},
		{ptr.To(intstr.FromString("35%")), 10, 3}, // 3.5 rounds down
	} {
		got, err := MaxUnavailable(tc.v, tc.selected)
		if err != nil || got != tc.want {
			t.Errorf("MaxUnavailable(%v, %d) = %d, %v; want %d", tc.v, tc.selected, got, err, tc.want)
		}
	}
}

func TestInvalidSpec(t *testing.T) {
	for name, mut := range map[string]func(*v1alpha1.ProxyConfig){
		"selector": func(c *v1alpha1.ProxyConfig) {
			c.Spec.NodeSelector = &v1alpha1.NodeSelector{MatchExpressions: []v1alpha1.NodeSelectorRequirement{{Key: "a", Operator: "In"}}}
		},
		"maxUnavailable": func(c *v1alpha1.ProxyConfig) { c.Spec.Rollout.MaxUnavailable = ptr.To(intstr.FromString("lots")) },
		"timeout":        func(c *v1alpha1.ProxyConfig) { c.Spec.Rollout.NodeTimeout = "soon" },
		"zeroTimeout":    func(c *v1alpha1.ProxyConfig) { c.Spec.Rollout.NodeTimeout = "0" },
		"pause":          func(c *v1alpha1.ProxyConfig) { c.Spec.Rollout.Canary.Pause = "-1s" },
		"mode":           func(c *v1alpha1.ProxyConfig) { c.Spec.Mode = "ebpf" },
	} {
		t.Run(name, func(t *testing.T) {
			s := newSim(t, 3, v1alpha1.ModeNFTables, mut)
			s.steps(3)
			st := s.cfg("pc").Status
			if st.Phase != v1alpha1.RolloutFailed || len(s.pns) != 0 {
				t.Fatalf("phase %s, %d ProxyNodes", st.Phase, len(s.pns))
			}
			for _, typ := range []string{v1alpha1.ConditionReady, v1alpha1.ConditionProgressing, v1alpha1.ConditionDegraded} {
				if c := s.cond("pc", typ); c.Reason != ReasonInvalidSpec || c.Message == "" {
					t.Errorf("%s %+v", typ, c)
				}
			}
			if res := Plan(s.input(s.cfg("pc"))); res.RequeueAfter != 0 {
				t.Error("invalid spec requeues")
			}
		})
	}
}
