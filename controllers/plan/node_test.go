package plan

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/proxyshift/proxyshift/api/contract"
	"github.com/proxyshift/proxyshift/api/v1alpha1"
)

// TestFailureIgnoresASwitchInProgress: a node that already observed its
// config and switches again (Ready=False Switching, phase CleaningUp) is
// in progress until its deadline; a real failure reason still fails it.
func TestFailureIgnoresASwitchInProgress(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	ref := &v1alpha1.ConfigReference{Name: "pc", Generation: 1}
	pn := func(phase v1alpha1.NodePhase, reason string) *v1alpha1.ProxyNode {
		return &v1alpha1.ProxyNode{
			ObjectMeta: metav1.ObjectMeta{CreationTimestamp: metav1.NewTime(now.Add(-time.Second))},
			Spec:       v1alpha1.ProxyNodeSpec{DesiredMode: v1alpha1.ModeIPTables, ConfigRef: ref},
			Status: v1alpha1.ProxyNodeStatus{Phase: phase, ActiveMode: v1alpha1.ModeIPTables, ObservedConfig: ref.DeepCopy(),
				Conditions: []metav1.Condition{{Type: contract.ConditionReady, Status: metav1.ConditionFalse, Reason: reason, Message: "m"}}},
		}
	}
	if failed, why, _ := failure(pn(v1alpha1.NodeCleaningUp, contract.ReasonSwitching), time.Minute, now); failed {
		t.Errorf("a switch in progress counted as failed: %s", why)
	}
	if failed, _, _ := failure(pn(v1alpha1.NodeCleaningUp, contract.ReasonSwitching), time.Minute, now.Add(2*time.Minute)); !failed {
		t.Error("a switch in progress past its deadline did not fail")
	}
	if failed, why, _ := failure(pn(v1alpha1.NodeActive, contract.ReasonSyncFailed), time.Minute, now); !failed || !strings.Contains(why, contract.ReasonSyncFailed) {
		t.Errorf("an Active node whose sync fails: failed %v (%s), want failed naming SyncFailed", failed, why)
	}
}
