package controllers

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
)

func pn() *v1alpha1.ProxyNode {
	return &v1alpha1.ProxyNode{
		ObjectMeta: metav1.ObjectMeta{Name: "n", Annotations: map[string]string{"a": "b"}},
		Spec:       v1alpha1.ProxyNodeSpec{DesiredMode: v1alpha1.ModeIPVS, ConfigRef: &v1alpha1.ConfigReference{Name: "pc", Generation: 1}},
		Status: v1alpha1.ProxyNodeStatus{
			ActiveMode: v1alpha1.ModeIPTables, Phase: v1alpha1.NodeActive,
			Kernel:     &v1alpha1.KernelFacts{Version: "6.1", NFTables: v1alpha1.CapabilityYes, ReportedTime: &metav1.Time{Time: time.Unix(1, 0)}},
			Conditions: []metav1.Condition{{Type: "Ready", Status: metav1.ConditionTrue, Reason: "Synced", Message: "ok"}},
		},
	}
}

func TestOnlyCounts(t *testing.T) {
	a := &v1alpha1.ProxyConfigStatus{Phase: v1alpha1.RolloutProgressing, Nodes: v1alpha1.NodeCounts{Updated: 1, Summary: "1/3"},
		Conditions: []metav1.Condition{{Type: "Ready", Status: metav1.ConditionFalse, Reason: "RolloutInProgress", Message: "1/3"}}}
	b := a.DeepCopy()
	b.Nodes.Updated, b.Nodes.Summary, b.Conditions[0].Message = 2, "2/3", "2/3"
	if !onlyCounts(a, b) {
		t.Error("counts and messages only: want true")
	}
	b.Conditions[0].Reason = "Paused"
	if onlyCounts(a, b) {
		t.Error("reason changed: want false")
	}
	b = a.DeepCopy()
	b.Phase = v1alpha1.RolloutCompleted
	if onlyCounts(a, b) {
		t.Error("phase changed: want false")
	}
	a.Findings = []v1alpha1.Finding{{Code: "LeavingKubeProxy", Severity: v1alpha1.SeverityInfo, Message: "(3 nodes)", Objects: []string{"node/a", "node/b", "node/c"}, Count: 3}}
	b = a.DeepCopy()
	b.Findings[0].Message, b.Findings[0].Objects, b.Findings[0].Count = "(2 nodes)", []string{"node/b", "node/c"}, 2
	if !onlyCounts(a, b) {
		t.Error("a finding's objects shrank: want true")
	}
	b.Findings = append(b.Findings, v1alpha1.Finding{Code: "HealthCheckNodePortNotServed", Severity: v1alpha1.SeverityCritical})
	if onlyCounts(a, b) {
		t.Error("a finding appeared: want false")
	}
}

func TestParallel(t *testing.T) {
	var running, peak, done atomic.Int64
	err := parallel(100, func(i int) error {
		n := running.Add(1)
		for {
			p := peak.Load()
			if n <= p || peak.CompareAndSwap(p, n) {
				break
			}
		}
		time.Sleep(time.Millisecond)
		running.Add(-1)
		done.Add(1)
		if i == 42 {
			return errors.New("boom")
		}
		return nil
	})
	if err == nil || err.Error() != "boom" || done.Load() != 100 {
		t.Errorf("err %v, %d done", err, done.Load())
	}
	if peak.Load() > writeConcurrency {
		t.Errorf("%d at once, limit %d", peak.Load(), writeConcurrency)
	}
	if parallel(0, nil) != nil {
		t.Error("empty")
	}
}

func TestMinPositive(t *testing.T) {
	for _, tc := range [][3]time.Duration{{0, 5, 5}, {3, 5, 3}, {5, 3, 3}, {4, 0, 4}, {0, 0, 0}} {
		if got := minPositive(tc[0], tc[1]); got != tc[2] {
			t.Errorf("minPositive(%v, %v) = %v", tc[0], tc[1], got)
		}
	}
}
