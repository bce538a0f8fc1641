package contract

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
)

func TestHealthy(t *testing.T) {
	for _, tc := range []struct {
		name  string
		conds []metav1.Condition
		ok    bool
		quote string
	}{
		{"no conditions say nothing", nil, true, ""},
		{"ready", []metav1.Condition{{Type: ConditionReady, Status: metav1.ConditionTrue}, {Type: ConditionDegraded, Status: metav1.ConditionFalse}}, true, ""},
		{"not ready", []metav1.Condition{{Type: ConditionReady, Status: metav1.ConditionFalse, Reason: ReasonSwitching, Message: "switching"}}, false, "condition Ready is False (Switching): switching"},
		{"degraded", []metav1.Condition{{Type: ConditionReady, Status: metav1.ConditionTrue}, {Type: ConditionDegraded, Status: metav1.ConditionTrue, Reason: ReasonSyncFailed}}, false, "condition Degraded is True (SyncFailed)"},
		{"other conditions say nothing", []metav1.Condition{{Type: "Other", Status: metav1.ConditionFalse}}, true, ""},
	} {
		ok, why := Healthy(&v1alpha1.ProxyNodeStatus{Conditions: tc.conds})
		if ok != tc.ok || !strings.HasPrefix(why, tc.quote) || (tc.quote == "") != (why == "") {
			t.Errorf("%s: Healthy = %v, %q; want %v, %q", tc.name, ok, why, tc.ok, tc.quote)
		}
	}
}
