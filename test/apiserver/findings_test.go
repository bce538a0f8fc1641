package apiserver_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	proxyv1alpha1 "github.com/proxyshift/proxyshift/api/v1alpha1"
	"github.com/proxyshift/proxyshift/test/testenv"
)

// TestFindingsSchema: the API server checks spec.rollout.acknowledgedFindings
// (CamelCase codes, no duplicates) and bounds status.findings.
func TestFindingsSchema(t *testing.T) {
	env := testenv.Start(t)
	ctx := context.Background()

	for _, tc := range []struct {
		name, spec string
		want       []string // nil: accepted
	}{
		{"ack-ok", "mode: nftables\nrollout:\n  acknowledgedFindings: [HealthCheckNodePortNotServed, LeavingKubeProxy]", nil},
		{"ack-lowercase", "mode: nftables\nrollout:\n  acknowledgedFindings: [healthCheck]", []string{"spec.rollout.acknowledgedFindings[0]", "should match"}},
		{"ack-duplicate", "mode: nftables\nrollout:\n  acknowledgedFindings: [LeavingKubeProxy, LeavingKubeProxy]", []string{"spec.rollout.acknowledgedFindings[1]", "Duplicate value"}},
	} {
		err := env.Client.Create(ctx, proxyConfig(t, tc.name, tc.spec))
		switch {
		case tc.want == nil && err != nil:
			t.Errorf("%s: rejected: %v", tc.name, err)
		case tc.want != nil && err == nil:
			t.Errorf("%s: accepted, want rejected with %q", tc.name, tc.want)
		case tc.want != nil:
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%s: error %q does not say %q", tc.name, err, w)
				}
			}
		}
	}

	cfg := &proxyv1alpha1.ProxyConfig{ObjectMeta: metav1.ObjectMeta{Name: "with-findings"}, Spec: proxyv1alpha1.ProxyConfigSpec{Mode: proxyv1alpha1.ModeIPVS}}
	if err := env.Client.Create(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	var objs []string
	for i := range proxyv1alpha1.MaxFindingObjects + 1 {
		objs = append(objs, fmt.Sprintf("default/svc-%02d", i))
	}
	f := proxyv1alpha1.Finding{Code: "ServiceIPsBecomeLocal", Severity: proxyv1alpha1.SeverityInfo, Message: "m", Action: "a", Count: 11}
	f.Objects = objs[:proxyv1alpha1.MaxFindingObjects]
	cfg.Status.Findings = []proxyv1alpha1.Finding{f}
	if err := env.Client.Status().Update(ctx, cfg); err != nil {
		t.Fatalf("ten objects: %v", err)
	}
	cfg.Status.Findings[0].Objects = objs
	err := env.Client.Status().Update(ctx, cfg)
	if err == nil || !strings.Contains(err.Error(), "status.findings[0].objects") || !strings.Contains(err.Error(), "at most 10") {
		t.Errorf("eleven objects: %v, want rejected naming status.findings[0].objects", err)
	}
}
