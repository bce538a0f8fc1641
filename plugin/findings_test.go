package plugin

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"sigs.k8s.io/yaml"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
	"github.com/proxyshift/proxyshift/test/testenv"
)

// TestFindingsAgainstAPIServer runs `findings` against a real API server
// holding a config with a Critical finding not acknowledged, one
// acknowledged, and an Info one cut at ten objects; and a config with
// none.
func TestFindingsAgainstAPIServer(t *testing.T) {
	env := testenv.Start(t)
	ctx := context.Background()
	c := env.Client

	cfg := &v1alpha1.ProxyConfig{ObjectMeta: metav1.ObjectMeta{Name: "takeover"}, Spec: v1alpha1.ProxyConfigSpec{Mode: v1alpha1.ModeNFTables,
		Rollout: v1alpha1.RolloutPolicy{AcknowledgedFindings: []string{"StrictARPDisabled", "KubeProxyHealthzNotServed"}}}}
	quiet := &v1alpha1.ProxyConfig{ObjectMeta: metav1.ObjectMeta{Name: "quiet"}, Spec: v1alpha1.ProxyConfigSpec{Mode: v1alpha1.ModeIPTables}}
	for _, o := range []*v1alpha1.ProxyConfig{cfg, quiet} {
		if err := c.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	var many []string
	for _, n := range []string{"a", "b", "c", "d", "e", "f", "g", "h", "i", "j"} {
		many = append(many, "default/svc-"+n)
	}
	cfg.Status = v1alpha1.ProxyConfigStatus{Phase: v1alpha1.RolloutPreflight, Findings: []v1alpha1.Finding{
		{Code: "HealthCheckNodePortNotServed", Severity: v1alpha1.SeverityCritical, Count: 1, Objects: []string{"shop/front"},
			Message: "Services rely on spec.healthCheckNodePort (1 Service on 2 nodes now served by kube-proxy (iptables))", Action: "Set externalTrafficPolicy: Cluster"},
		{Code: "LocalhostNodePortsNotServed", Severity: v1alpha1.SeverityWarning, Count: 2, Objects: []string{"default/web", "shop/front"},
			Message: "NodePorts on 127.0.0.1 are not served", Action: "Use the node's own address"},
		{Code: "ServiceIPsBecomeLocal", Severity: v1alpha1.SeverityInfo, Count: 14, Objects: many,
			Message: "Service IPs become local", Action: "Bind host-network listeners to specific addresses"},
	}}
	if err := c.Status().Update(ctx, cfg); err != nil {
		t.Fatal(err)
	}

	run := func(t *testing.T, args ...string) (string, error) {
		t.Helper()
		var out bytes.Buffer
		cmd := newCommand(genericiooptions.IOStreams{Out: &out, ErrOut: &out}, time.Now)
		cmd.SetArgs(append(args, "--kubeconfig", env.Kubeconfig))
		err := cmd.ExecuteContext(ctx)
		return out.String(), err
	}

	t.Run("table", func(t *testing.T) {
		out, err := run(t, "findings", "takeover")
		if err != nil {
			t.Fatal(err)
		}
		golden(t, "findings.txt", out)
		out, err = run(t, "findings", "quiet")
		if err != nil || !strings.Contains(out, "proxyconfig/quiet: no findings") {
			t.Errorf("findings quiet: %v %q", err, out)
		}
	})
	t.Run("json and yaml", func(t *testing.T) {
		for _, format := range []string{"json", "yaml"} {
			out, err := run(t, "findings", "takeover", "-o", format)
			if err != nil {
				t.Fatal(err)
			}
			var got []v1alpha1.Finding
			if format == "json" {
				err = json.Unmarshal([]byte(out), &got)
			} else {
				err = yaml.Unmarshal([]byte(out), &got)
			}
			if err != nil || len(got) != 3 || got[0].Code != "HealthCheckNodePortNotServed" || got[2].Count != 14 {
				t.Errorf("-o %s: %v %+v, want the three findings", format, err, got)
			}
		}
		if out, err := run(t, "findings", "quiet", "-o", "json"); err != nil || strings.TrimSpace(out) != "[]" {
			t.Errorf("-o json with no findings: %v %q, want []", err, out)
		}
	})
	t.Run("missing config", func(t *testing.T) {
		if _, err := run(t, "findings", "no-such-config"); err == nil || !strings.Contains(err.Error(), `"no-such-config" not found`) {
			t.Errorf("findings of a missing config: %v, want not found", err)
		}
	})
}
