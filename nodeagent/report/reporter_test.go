package report

import (
	"errors"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/proxyshift/proxyshift/api/contract"
	"github.com/proxyshift/proxyshift/api/v1alpha1"
	"github.com/proxyshift/proxyshift/nodeagent/dataplane"
)

func TestStatus(t *testing.T) {
	ref := &v1alpha1.ConfigReference{Name: "pc", Generation: 3}
	r := New(nil, "n")
	r.SetSwitch(Switch{Phase: v1alpha1.NodeProgramming, Active: v1alpha1.ModeIPTables, Target: v1alpha1.ModeNFTables, Config: ref, Generation: 7})
	st := r.Status()
	ready := meta.FindStatusCondition(st.Conditions, contract.ConditionReady)
	if st.Phase != v1alpha1.NodeProgramming || st.ActiveMode != v1alpha1.ModeIPTables || st.ObservedConfig != nil ||
		ready == nil || ready.Status != metav1.ConditionFalse || ready.Reason != contract.ReasonSwitching || ready.ObservedGeneration != 7 {
		t.Errorf("during a switch: %+v", st)
	}

	r.SetSwitch(Switch{Phase: v1alpha1.NodeActive, Active: v1alpha1.ModeNFTables, Target: v1alpha1.ModeNFTables, Config: ref, Generation: 7})
	r.SetSync(Sync{Time: time.Now(), Duration: time.Millisecond, Counts: dataplane.Counts{Services: 2, Endpoints: 4, Rules: 30}})
	st = r.Status()
	ready = meta.FindStatusCondition(st.Conditions, contract.ConditionReady)
	deg := meta.FindStatusCondition(st.Conditions, contract.ConditionDegraded)
	if st.ObservedConfig == nil || *st.ObservedConfig != *ref || ready.Status != metav1.ConditionTrue || deg.Status != metav1.ConditionFalse ||
		st.Counts == nil || st.Counts.Rules != 30 || st.LastSyncTime == nil {
		t.Errorf("active: %+v", st)
	}

	r.SetSync(Sync{Time: time.Now(), Err: errors.New("netlink: EPERM")})
	st = r.Status()
	ready = meta.FindStatusCondition(st.Conditions, contract.ConditionReady)
	if ready.Status != metav1.ConditionFalse || ready.Reason != contract.ReasonSyncFailed || st.Counts.Rules != 30 {
		t.Errorf("failed sync: %+v", st)
	}

	r.SetSwitch(Switch{Phase: v1alpha1.NodeFailed, Active: v1alpha1.ModeNFTables, Target: v1alpha1.ModeIPVS, Config: ref, Generation: 8, Reason: "ModuleMissing", Message: "kernel module ip_vs is missing"})
	st = r.Status()
	deg = meta.FindStatusCondition(st.Conditions, contract.ConditionDegraded)
	if st.Phase != v1alpha1.NodeFailed || deg.Status != metav1.ConditionTrue || deg.Reason != "ModuleMissing" || deg.ObservedGeneration != 8 {
		t.Errorf("failed: %+v", st)
	}
}

func TestKernelFactsTimeChangesOnlyWithTheFacts(t *testing.T) {
	r := New(nil, "n")
	f := v1alpha1.KernelFacts{Version: "6.1", NFTables: v1alpha1.CapabilityYes}
	r.SetKernel(f)
	first := r.Status().Kernel.ReportedTime
	time.Sleep(1100 * time.Millisecond)
	r.SetKernel(f)
	if got := r.Status().Kernel.ReportedTime; !got.Equal(first) {
		t.Errorf("same facts changed reportedTime %v -> %v", first, got)
	}
	f.NFTables = v1alpha1.CapabilityNo
	r.SetKernel(f)
	if got := r.Status().Kernel; got.NFTables != v1alpha1.CapabilityNo || got.ReportedTime.Equal(first) {
		t.Errorf("new facts: %+v", got)
	}
}

func TestSameButSyncTime(t *testing.T) {
	a := v1alpha1.ProxyNodeStatus{Phase: v1alpha1.NodeActive, LastSyncTime: &metav1.Time{Time: time.Unix(1, 0)}}
	b := a
	b.LastSyncTime = &metav1.Time{Time: time.Unix(2, 0)}
	if !sameButSyncTime(a, b) {
		t.Error("only the sync time differs")
	}
	b.Phase = v1alpha1.NodeFailed
	if sameButSyncTime(a, b) {
		t.Error("the phase differs")
	}
}

// TestJudgeWrite: a write holds the status written only if it patched
// the ProxyNode it took the difference from and the Reporter has not
// learned of another one since.
func TestJudgeWrite(t *testing.T) {
	for _, tc := range []struct {
		name                  string
		started, patched, now types.UID
		want                  writeOutcome
	}{
		{"the same ProxyNode throughout", "a", "a", "a", writeRecorded},
		{"the whole status to the first one known", "", "a", "", writeRecorded},
		{"the whole status to the one just observed", "", "b", "b", writeRecorded},
		{"a difference applied to a recreated one", "a", "b", "a", writeLandedElsewhere},
		{"a difference applied to a recreated one already observed", "a", "b", "b", writeLandedElsewhere},
		{"the old one patched, then observed recreated", "a", "a", "b", writeOutdated},
		{"the old one patched, then observed gone", "a", "a", "", writeOutdated},
		{"the whole status, while another one was observed", "", "b", "c", writeOutdated},
	} {
		if got := judgeWrite(tc.started, tc.patched, tc.now); got != tc.want {
			t.Errorf("%s: judgeWrite(%q, %q, %q) = %d, want %d", tc.name, tc.started, tc.patched, tc.now, got, tc.want)
		}
	}
}

// TestObserveForgetsAnotherProxyNodesStatus: the status read from one
// ProxyNode is not built on for another of the same name.
func TestObserveForgetsAnotherProxyNodesStatus(t *testing.T) {
	r := New(nil, "n")
	old := &v1alpha1.ProxyNode{ObjectMeta: metav1.ObjectMeta{Name: "n", UID: "a"}, Status: v1alpha1.ProxyNodeStatus{
		ObservedConfig: &v1alpha1.ConfigReference{Name: "cluster", Generation: 3},
	}}
	r.Seed(old)
	r.Observe(old)
	if r.Status().ObservedConfig == nil {
		t.Fatal("the same ProxyNode observed: the status read from it is forgotten")
	}
	recreated := &v1alpha1.ProxyNode{ObjectMeta: metav1.ObjectMeta{Name: "n", UID: "b"}}
	r.Observe(recreated)
	if got := r.Status().ObservedConfig; got != nil {
		t.Errorf("a recreated ProxyNode observed: the old one's observedConfig %+v is still built on", got)
	}
}

// TestWarningIsDegraded: a serving mode whose syncs leave another
// program's objects alone is Ready and Degraded (ForeignObjects), naming
// them.
func TestWarningIsDegraded(t *testing.T) {
	r := New(nil, "n")
	r.SetSwitch(Switch{Phase: v1alpha1.NodeActive, Active: v1alpha1.ModeIPVS, Target: v1alpha1.ModeIPVS, Generation: 2})
	r.SetSync(Sync{Time: time.Now(), Counts: dataplane.Counts{Services: 2}, Warning: errors.New("ipvs: 1 virtual services exist that are not proxyshift's: tcp/198.18.0.1:80")})
	st := r.Status()
	ready := meta.FindStatusCondition(st.Conditions, contract.ConditionReady)
	deg := meta.FindStatusCondition(st.Conditions, contract.ConditionDegraded)
	if ready.Status != metav1.ConditionTrue || deg.Status != metav1.ConditionTrue || deg.Reason != contract.ReasonForeignObjects ||
		!strings.Contains(deg.Message, "tcp/198.18.0.1:80") {
		t.Errorf("ready %+v, degraded %+v", ready, deg)
	}
}
