// Package apiserver_test checks the proxyshift API against a real
// kube-apiserver: schema validation and defaults, the kustomize install,
// and what kubectl prints.
package apiserver_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	proxyv1alpha1 "github.com/proxyshift/proxyshift/api/v1alpha1"
	"github.com/proxyshift/proxyshift/test/testenv"
)

// proxyConfig parses a ProxyConfig whose spec is given as YAML.
func proxyConfig(t *testing.T, name, spec string) *unstructured.Unstructured {
	t.Helper()
	doc := fmt.Sprintf("apiVersion: network.proxyshift.io/v1alpha1\nkind: ProxyConfig\nmetadata:\n  name: %s\nspec:\n%s", name, indent(spec))
	obj := &unstructured.Unstructured{}
	if err := yaml.Unmarshal([]byte(doc), &obj.Object); err != nil {
		t.Fatalf("bad test YAML for %s: %v\n%s", name, err, doc)
	}
	return obj
}

func indent(s string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	for i, l := range lines {
		lines[i] = "  " + l
	}
	return strings.Join(lines, "\n") + "\n"
}

func TestAPI(t *testing.T) {
	env := testenv.Start(t)
	ctx := context.Background()

	t.Run("InvalidProxyConfigsRejected", func(t *testing.T) {
		// Each case must be rejected by the API server itself, with a
		// message that names the field and says what is allowed.
		cases := []struct {
			name string
			spec string
			want []string
		}{
			{"missing-mode", "nodeSelector: {}", []string{"spec.mode", "Required value"}},
			{"unknown-mode", "mode: userspace", []string{"spec.mode", `Unsupported value: "userspace"`, `"iptables", "nftables", "ipvs"`}},
			{"unknown-scheduler", "mode: ipvs\nipvs:\n  scheduler: fastest", []string{"spec.ipvs.scheduler", `Unsupported value: "fastest"`, `"rr"`, `"mh"`}},
			{"cluster-cidr-bad-prefix", "mode: nftables\nclusterCIDRs: [198.18.0.0/33]", []string{"spec.clusterCIDRs[0]", "must be a CIDR"}},
			{"cluster-cidr-not-an-address", "mode: nftables\nclusterCIDRs: [pods]", []string{"spec.clusterCIDRs[0]", "must be a CIDR"}},
			{"cluster-cidr-second-bad", "mode: nftables\nclusterCIDRs: [198.18.0.0/16, 198.19.0.0]", []string{"spec.clusterCIDRs[1]", "must be a CIDR"}},
			{"exclude-cidr-bad", "mode: ipvs\nipvs:\n  excludeCIDRs: [300.1.1.0/24]", []string{"spec.ipvs.excludeCIDRs[0]", "must be a CIDR"}},
			{"nodeport-address-interface-name", "mode: nftables\nnodePortAddresses: [eth0]", []string{"spec.nodePortAddresses[0]", "must be a CIDR", "or the word primary"}},
			{"nodeport-primary-with-cidr", "mode: nftables\nnodePortAddresses: [primary, 198.18.0.0/24]", []string{"spec.nodePortAddresses", "primary cannot be combined with CIDRs"}},
			{"max-unavailable-zero", "mode: nftables\nrollout:\n  maxUnavailable: 0", []string{"spec.rollout.maxUnavailable", "at least 1", "1% to 100%"}},
			{"max-unavailable-zero-percent", "mode: nftables\nrollout:\n  maxUnavailable: 0%", []string{"spec.rollout.maxUnavailable", "at least 1", "1% to 100%"}},
			{"max-unavailable-negative", "mode: nftables\nrollout:\n  maxUnavailable: -2", []string{"spec.rollout.maxUnavailable", "at least 1"}},
			{"max-unavailable-over-100-percent", "mode: nftables\nrollout:\n  maxUnavailable: 150%", []string{"spec.rollout.maxUnavailable", "1% to 100%"}},
			{"max-unavailable-words", "mode: nftables\nrollout:\n  maxUnavailable: half", []string{"spec.rollout.maxUnavailable", "1% to 100%"}},
			{"masquerade-bit-32", "mode: iptables\niptables:\n  masqueradeBit: 32", []string{"spec.iptables.masqueradeBit", "less than or equal to 31"}},
			{"masquerade-bit-negative", "mode: iptables\niptables:\n  masqueradeBit: -1", []string{"spec.iptables.masqueradeBit", "greater than or equal to 0"}},
			{"sync-period-negative", "mode: iptables\niptables:\n  syncPeriod: -30s", []string{"spec.iptables.syncPeriod", "non-negative duration"}},
			{"sync-period-unparsable", "mode: nftables\nnftables:\n  syncPeriod: soon", []string{"spec.nftables.syncPeriod", "non-negative duration"}},
			{"node-timeout-with-spaces", "mode: nftables\nrollout:\n  nodeTimeout: 5 minutes", []string{"spec.rollout.nodeTimeout", "non-negative duration"}},
			{"tcp-timeout-days", "mode: ipvs\nipvs:\n  tcpTimeout: 1d", []string{"spec.ipvs.tcpTimeout", "units ns, us, ms, s, m, h"}},
			{"canary-pause-negative", "mode: nftables\nrollout:\n  canary:\n    pause: -5m", []string{"spec.rollout.canary.pause", "non-negative duration"}},
			{"canary-too-large", "mode: nftables\nrollout:\n  canary:\n    nodes: 51", []string{"spec.rollout.canary.nodes", "less than or equal to 50"}},
			{"canary-negative", "mode: nftables\nrollout:\n  canary:\n    nodes: -1", []string{"spec.rollout.canary.nodes", "greater than or equal to 0"}},
			{"iptables-settings-in-nftables-mode", "mode: nftables\niptables:\n  masqueradeAll: true", []string{"spec.iptables", "only be set when spec.mode is iptables"}},
			{"ipvs-settings-in-iptables-mode", "mode: iptables\nipvs:\n  scheduler: rr", []string{"spec.ipvs", "only be set when spec.mode is ipvs"}},
			{"nftables-settings-in-ipvs-mode", "mode: ipvs\nnftables:\n  syncPeriod: 1m", []string{"spec.nftables", "only be set when spec.mode is nftables"}},
			{"kube-proxy-mode-change-in-nftables-mode", "mode: nftables\nkubeProxy:\n  mode: ipvs", []string{"spec.kubeProxy", "only be set when spec.mode is kube-proxy"}},
			{"kube-proxy-mode-change-to-userspace", "mode: kube-proxy\nkubeProxy:\n  mode: userspace", []string{"spec.kubeProxy.mode", `Unsupported value: "userspace"`, `"iptables", "nftables", "ipvs"`}},
			{"kube-proxy-mode-change-without-mode", "mode: kube-proxy\nkubeProxy:\n  bridge: nftables", []string{"spec.kubeProxy.mode", "Required value"}},
			// An IPv4-mapped IPv6 network is no network a dataplane can
			// program (it used to panic the nftables backend).
			{"cluster-cidr-ipv4-mapped", "mode: nftables\nclusterCIDRs: ['::ffff:10.0.0.0/104']", []string{"spec.clusterCIDRs[0]", "IPv4-mapped"}},
			{"cluster-cidr-ipv4-mapped-hex", "mode: nftables\nclusterCIDRs: ['::ffff:a00:0/104']", []string{"spec.clusterCIDRs[0]", "IPv4-mapped"}},
			{"exclude-cidr-ipv4-mapped", "mode: ipvs\nipvs:\n  excludeCIDRs: ['::ffff:198.19.0.0/112']", []string{"spec.ipvs.excludeCIDRs[0]", "IPv4-mapped"}},
			{"nodeport-address-ipv4-mapped", "mode: nftables\nnodePortAddresses: ['::ffff:198.18.0.0/111']", []string{"spec.nodePortAddresses[0]", "IPv4-mapped"}},
			// nodeSelector: keys, operators and values are checked as the
			// API server checks any label selector.
			{"selector-label-key", "mode: nftables\nnodeSelector:\n  matchLabels:\n    'bad key!': x", []string{"spec.nodeSelector.matchLabels", `invalid label key "bad key!"`, "name part must consist of alphanumeric characters"}},
			{"selector-label-key-prefix", "mode: nftables\nnodeSelector:\n  matchLabels:\n    'Example.COM/role': x", []string{"spec.nodeSelector.matchLabels", `"Example.COM/role"`, "prefix part", "lower case"}},
			{"selector-label-key-too-long", "mode: nftables\nnodeSelector:\n  matchLabels:\n    " + strings.Repeat("k", 64) + ": x", []string{"spec.nodeSelector.matchLabels", "name part must be no more than 63"}},
			{"selector-label-value", "mode: nftables\nnodeSelector:\n  matchLabels:\n    role: 'two words'", []string{"spec.nodeSelector.matchLabels[role]", `invalid label value "two words"`, "a valid label must be an empty string or consist of alphanumeric characters"}},
			{"selector-label-value-too-long", "mode: nftables\nnodeSelector:\n  matchLabels:\n    role: " + strings.Repeat("v", 64), []string{"spec.nodeSelector.matchLabels.role", "may not be more than 63"}},
			{"selector-expression-key", "mode: nftables\nnodeSelector:\n  matchExpressions:\n  - {key: '-role', operator: Exists}", []string{"spec.nodeSelector.matchExpressions[0].key", `invalid label key "-role"`, "must start and end with an alphanumeric character"}},
			{"selector-expression-operator", "mode: nftables\nnodeSelector:\n  matchExpressions:\n  - {key: role, operator: Like, values: [a]}", []string{"spec.nodeSelector.matchExpressions[0].operator", `Unsupported value: "Like"`, `"In", "NotIn", "Exists", "DoesNotExist"`}},
			{"selector-expression-in-without-values", "mode: nftables\nnodeSelector:\n  matchExpressions:\n  - {key: role, operator: In}", []string{"spec.nodeSelector.matchExpressions[0].values", "values must be specified when operator is In or NotIn"}},
			{"selector-expression-exists-with-values", "mode: nftables\nnodeSelector:\n  matchExpressions:\n  - {key: role, operator: Exists, values: [a]}", []string{"spec.nodeSelector.matchExpressions[0].values", "values may not be specified when operator is Exists or DoesNotExist"}},
			{"selector-expression-value", "mode: nftables\nnodeSelector:\n  matchExpressions:\n  - {key: role, operator: NotIn, values: [ok, 'not ok']}", []string{"spec.nodeSelector.matchExpressions[0].values[1]", `invalid label value "not ok"`}},
		}
		if len(cases) < 20 {
			t.Fatalf("the table must hold at least 20 invalid configs, has %d", len(cases))
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				err := env.Client.Create(ctx, proxyConfig(t, "invalid-"+tc.name, tc.spec))
				if err == nil {
					t.Fatalf("API server accepted an invalid ProxyConfig:\n%s", tc.spec)
				}
				for _, w := range tc.want {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("rejection message lacks %q:\n%v", w, err)
					}
				}
			})
		}
	})

	t.Run("InvalidProxyNodeSettingsRejected", func(t *testing.T) {
		// A ProxyNode's spec.settings are the same types as a
		// ProxyConfig's, checked the same way.
		for i, tc := range []struct {
			settings proxyv1alpha1.ProxySettings
			want     []string
		}{
			{proxyv1alpha1.ProxySettings{ClusterCIDRs: []proxyv1alpha1.CIDR{"::ffff:10.0.0.0/104"}}, []string{"spec.settings.clusterCIDRs[0]", "IPv4-mapped"}},
			{proxyv1alpha1.ProxySettings{ClusterCIDRs: []proxyv1alpha1.CIDR{"198.18.0.0/33"}}, []string{"spec.settings.clusterCIDRs[0]", "must be a CIDR"}},
			{proxyv1alpha1.ProxySettings{NodePortAddresses: []proxyv1alpha1.NodePortAddress{"::ffff:198.18.0.0/111"}}, []string{"spec.settings.nodePortAddresses[0]", "IPv4-mapped"}},
			{proxyv1alpha1.ProxySettings{IPVS: &proxyv1alpha1.IPVSSettings{ExcludeCIDRs: []proxyv1alpha1.CIDR{"::ffff:198.19.0.0/112"}}}, []string{"spec.settings.ipvs.excludeCIDRs[0]", "IPv4-mapped"}},
		} {
			pn := &proxyv1alpha1.ProxyNode{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("invalid-%d", i)},
				Spec: proxyv1alpha1.ProxyNodeSpec{DesiredMode: proxyv1alpha1.ModeNFTables, Settings: tc.settings}}
			err := env.Client.Create(ctx, pn)
			if err == nil {
				t.Errorf("API server accepted ProxyNode settings %+v", tc.settings)
				continue
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("rejection message lacks %q:\n%v", w, err)
				}
			}
		}
	})

	t.Run("ValidProxyConfigsGetDefaults", func(t *testing.T) {
		check := func(t *testing.T, name, spec string) *proxyv1alpha1.ProxyConfig {
			t.Helper()
			if err := env.Client.Create(ctx, proxyConfig(t, name, spec)); err != nil {
				t.Fatalf("valid ProxyConfig rejected: %v\n%s", err, spec)
			}
			got := &proxyv1alpha1.ProxyConfig{}
			if err := env.Client.Get(ctx, clientKey(name), got); err != nil {
				t.Fatal(err)
			}
			r := got.Spec.Rollout
			if r.MaxUnavailable == nil || r.Canary.Nodes == nil || r.AutoRollback == nil || r.NodeTimeout == "" {
				t.Fatalf("rollout defaults missing: %+v", r)
			}
			return got
		}
		t.Run("minimal", func(t *testing.T) {
			got := check(t, "valid-minimal", "mode: nftables")
			r := got.Spec.Rollout
			if r.MaxUnavailable.String() != "1" || *r.Canary.Nodes != 1 || r.NodeTimeout != "5m" || !*r.AutoRollback || r.Paused {
				t.Errorf("defaults: maxUnavailable=%s canary=%d nodeTimeout=%s autoRollback=%v paused=%v; want 1, 1, 5m, true, false",
					r.MaxUnavailable, *r.Canary.Nodes, r.NodeTimeout, *r.AutoRollback, r.Paused)
			}
		})
		t.Run("iptables-masquerade-bit", func(t *testing.T) {
			got := check(t, "valid-iptables", "mode: iptables\niptables:\n  masqueradeAll: true\nclusterCIDRs: [198.18.0.0/16, fd00:10::/64]\nnodePortAddresses: [primary]")
			if got.Spec.IPTables.MasqueradeBit == nil || *got.Spec.IPTables.MasqueradeBit != 14 {
				t.Errorf("masqueradeBit default: got %v, want 14", got.Spec.IPTables.MasqueradeBit)
			}
		})
		t.Run("ipvs-scheduler", func(t *testing.T) {
			got := check(t, "valid-ipvs", "mode: ipvs\nipvs:\n  strictARP: true\n  tcpTimeout: 1h30m\n  excludeCIDRs: [198.19.0.0/16]\nrollout:\n  maxUnavailable: 30%\n  canary:\n    nodes: 0\n    pause: 1m30s\n  nodeTimeout: 0s")
			if got.Spec.IPVS.Scheduler != "rr" {
				t.Errorf("scheduler default: got %q, want rr", got.Spec.IPVS.Scheduler)
			}
			if got.Spec.Rollout.MaxUnavailable.String() != "30%" || *got.Spec.Rollout.Canary.Nodes != 0 {
				t.Errorf("explicit rollout values changed: %+v", got.Spec.Rollout)
			}
		})
	})

	t.Run("KustomizeInstall", func(t *testing.T) {
		rendered, err := env.Kubectl(t, "kustomize", "config/default")
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{"kind: Namespace", "name: proxyshift-system", "kind: Deployment", "kind: DaemonSet", "hostNetwork: true", "SYS_MODULE", "system-node-critical", "startupProbe", "kind: ValidatingAdmissionPolicy"} {
			if !strings.Contains(rendered, want) {
				t.Errorf("kubectl kustomize config/default lacks %q", want)
			}
		}
		out, err := env.Kubectl(t, "apply", "-k", "config/default")
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{
			"namespace/proxyshift-system created",
			"customresourcedefinition.apiextensions.k8s.io/proxyconfigs.network.proxyshift.io",
			"clusterrole.rbac.authorization.k8s.io/proxyshift-operator created",
			"clusterrole.rbac.authorization.k8s.io/proxyshift-agent created",
			"clusterrole.rbac.authorization.k8s.io/proxyshift-metrics-reader created",
			"deployment.apps/proxyshift-operator created",
			"daemonset.apps/proxyshift-agent created",
			"service/proxyshift-operator-metrics created",
			"validatingadmissionpolicy.admissionregistration.k8s.io/proxyshift-agent-own-proxynode created",
			"validatingadmissionpolicybinding.admissionregistration.k8s.io/proxyshift-agent-own-proxynode created",
		} {
			if !strings.Contains(out, want) {
				t.Errorf("kubectl apply -k config/default output lacks %q:\n%s", want, out)
			}
		}
		// The agent may write its ProxyNode's status but not the spec. The
		// API server's RBAC cache lags writes a little, so wait for "yes".
		agent := "--as=system:serviceaccount:proxyshift-system:proxyshift-agent"
		canI := func(args ...string) string {
			out, _ := env.Kubectl(t, append([]string{"auth", "can-i"}, args...)...)
			return strings.TrimSpace(out)
		}
		deadline := time.Now().Add(20 * time.Second)
		for canI("patch", "proxynodes", "--subresource=status", agent) != "yes" {
			if time.Now().After(deadline) {
				t.Fatal("the agent's ServiceAccount may not patch ProxyNode status")
			}
			time.Sleep(200 * time.Millisecond)
		}
		for _, verb := range []string{"update", "patch", "create", "delete"} {
			if got := canI(verb, "proxynodes", agent); got != "no" {
				t.Errorf("agent may %s ProxyNodes (kubectl auth can-i said %q); it should only patch their status", verb, got)
			}
		}
		if got := canI("update", "proxyconfigs", "--subresource=status", "--as=system:serviceaccount:proxyshift-system:proxyshift-operator"); got != "yes" {
			t.Errorf("operator may not update ProxyConfig status (kubectl auth can-i said %q)", got)
		}
	})

	t.Run("ImagesMatchWhatMakeImagesBuilds", func(t *testing.T) {
		// config/default runs the images images/*/image.yaml name (what
		// `make images` tags); config/local runs the same images and never
		// pulls them, since they are imported onto the nodes.
		want := map[string]string{}
		for _, c := range []string{"operator", "agent"} {
			b, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "images", c, "image.yaml"))
			if err != nil {
				t.Fatal(err)
			}
			var spec struct {
				Ref string `json:"ref"`
			}
			if err := yaml.Unmarshal(b, &spec); err != nil {
				t.Fatal(err)
			}
			want["proxyshift-"+c] = spec.Ref
		}
		for _, overlay := range []struct {
			dir, pullPolicy string
		}{{"config/default", ""}, {"config/local", "Never"}} {
			rendered, err := env.Kubectl(t, "kustomize", overlay.dir)
			if err != nil {
				t.Fatal(err)
			}
			seen := 0
			for _, doc := range strings.Split(rendered, "\n---\n") {
				var obj struct {
					Kind     string
					Metadata struct{ Name string }
					Spec     struct {
						Template struct {
							Spec struct {
								Containers []struct{ Image, ImagePullPolicy string }
							}
						}
					}
				}
				if err := yaml.Unmarshal([]byte(doc), &obj); err != nil {
					t.Fatalf("%s: %v", overlay.dir, err)
				}
				if obj.Kind != "Deployment" && obj.Kind != "DaemonSet" {
					continue
				}
				for _, c := range obj.Spec.Template.Spec.Containers {
					seen++
					if c.Image != want[obj.Metadata.Name] || c.ImagePullPolicy != overlay.pullPolicy {
						t.Errorf("%s: %s %s runs %q pullPolicy %q; want %q pullPolicy %q",
							overlay.dir, obj.Kind, obj.Metadata.Name, c.Image, c.ImagePullPolicy, want[obj.Metadata.Name], overlay.pullPolicy)
					}
				}
			}
			if seen != 2 {
				t.Errorf("%s renders %d containers, want the operator's and the agent's", overlay.dir, seen)
			}
		}
	})

	t.Run("PrinterColumns", func(t *testing.T) {
		if _, err := env.Kubectl(t, "apply", "-f", "config/samples/network_v1alpha1_proxyconfig_iptables.yaml"); err != nil {
			t.Fatal(err)
		}
		pc := &proxyv1alpha1.ProxyConfig{}
		if err := env.Client.Get(ctx, clientKey("iptables"), pc); err != nil {
			t.Fatal(err)
		}
		pc.Status = proxyv1alpha1.ProxyConfigStatus{
			Phase: proxyv1alpha1.RolloutProgressing, TargetMode: proxyv1alpha1.ModeIPTables, Selector: "proxy-mode=iptables",
			KubeProxyBridge: &proxyv1alpha1.KubeProxyBridgeStatus{Stage: proxyv1alpha1.BridgeHandingBack, From: "iptables", To: "nftables", Bridge: "nftables", ConfigMap: "kube-system/kube-proxy:config.conf"},
			Nodes:           proxyv1alpha1.NodeCounts{Selected: 5, Updated: 3, Ready: 5, Failed: 1, Summary: "3/5"},
			Conditions:      []metav1.Condition{{Type: proxyv1alpha1.ConditionReady, Status: metav1.ConditionFalse, Reason: "RolloutInProgress", Message: "3 of 5 nodes updated", LastTransitionTime: metav1.Now()}},
		}
		if err := env.Client.Status().Update(ctx, pc); err != nil {
			t.Fatal(err)
		}
		out, err := env.Kubectl(t, "get", "proxyconfig")
		if err != nil {
			t.Fatal(err)
		}
		expectTable(t, out, []string{"NAME", "MODE", "PHASE", "UPDATED", "READY", "AGE"}, []string{"iptables", "iptables", "Progressing", "3/5", "False"})
		// The short name kubectl resolves to ProxyConfig: "pxc" ("pc" is
		// the built-in PriorityClass's, which kubectl prefers).
		out, err = env.Kubectl(t, "get", "pxc", "-o", "wide")
		if err != nil {
			t.Fatal(err)
		}
		expectTable(t, out, []string{"NAME", "MODE", "PHASE", "UPDATED", "READY", "AGE", "TARGET", "FAILED", "SELECTOR", "BRIDGE"}, []string{"iptables", "Progressing", "3/5", "False", "1", "proxy-mode=iptables", "HandingBack"})

		pn := &proxyv1alpha1.ProxyNode{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}, Spec: proxyv1alpha1.ProxyNodeSpec{DesiredMode: proxyv1alpha1.ModeNFTables}}
		if err := env.Client.Create(ctx, pn); err != nil {
			t.Fatal(err)
		}
		// Ten hours ago shows as "10h" for an hour (five minutes would show
		// as "5m1s" once a second has passed on a busy machine).
		synced := metav1.NewTime(time.Now().Add(-10 * time.Hour))
		pn.Status = proxyv1alpha1.ProxyNodeStatus{ActiveMode: proxyv1alpha1.ModeIPTables, KubeProxyMode: proxyv1alpha1.ModeIPTables, Phase: proxyv1alpha1.NodeProgramming, LastSyncTime: &synced, Counts: &proxyv1alpha1.RuleCounts{Services: 10, Endpoints: 30, Rules: 1234}}
		if err := env.Client.Status().Update(ctx, pn); err != nil {
			t.Fatal(err)
		}
		out, err = env.Kubectl(t, "get", "pn")
		if err != nil {
			t.Fatal(err)
		}
		expectTable(t, out, []string{"NAME", "DESIRED", "ACTIVE", "PHASE", "KUBE-PROXY", "RULES", "LAST-SYNC", "AGE"}, []string{"node-a", "nftables", "iptables", "Programming", "iptables", "1234", "10h"})
	})

	t.Run("ShortNamesResolveToProxyshift", func(t *testing.T) {
		// kubectl resolves a short name to the first resource that declares
		// it, built-in ones first: ours must be declared by nothing else.
		for short, kind := range map[string]string{"pxc": "ProxyConfig", "pn": "ProxyNode"} {
			out, err := env.Kubectl(t, "explain", short)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(out, "GROUP:      network.proxyshift.io") || !strings.Contains(out, "KIND:       "+kind) {
				t.Errorf("kubectl explain %s does not describe network.proxyshift.io %s:\n%.400s", short, kind, out)
			}
		}
		out, err := env.Kubectl(t, "api-resources", "--api-group=network.proxyshift.io", "--no-headers")
		if err != nil {
			t.Fatal(err)
		}
		for _, short := range strings.Fields(out) {
			if short == "pc" {
				t.Errorf("a proxyshift kind still declares the short name pc, which kubectl resolves to PriorityClass:\n%s", out)
			}
		}
	})

	t.Run("KernelSettingsInStatus", func(t *testing.T) {
		pn := &proxyv1alpha1.ProxyNode{ObjectMeta: metav1.ObjectMeta{Name: "node-settings"}, Spec: proxyv1alpha1.ProxyNodeSpec{DesiredMode: proxyv1alpha1.ModeIPVS}}
		if err := env.Client.Create(ctx, pn); err != nil {
			t.Fatal(err)
		}
		settings := []proxyv1alpha1.KernelSetting{
			{Name: "net.ipv4.vs.conntrack", Want: "1", Value: "1"},
			{Name: "net.ipv4.vs.conn_reuse_mode", Want: "1", Value: "0"},
			{Name: "net.ipv4.conf.all.arp_ignore", Want: "1"}, // could not be read
		}
		pn.Status = proxyv1alpha1.ProxyNodeStatus{ActiveMode: proxyv1alpha1.ModeIPVS, Kernel: &proxyv1alpha1.KernelFacts{Version: "6.1.0", Settings: settings}}
		if err := env.Client.Status().Update(ctx, pn); err != nil {
			t.Fatal(err)
		}
		got := &proxyv1alpha1.ProxyNode{}
		if err := env.Client.Get(ctx, clientKey("node-settings"), got); err != nil {
			t.Fatal(err)
		}
		if got.Status.Kernel == nil || !reflect.DeepEqual(got.Status.Kernel.Settings, settings) {
			t.Errorf("status.kernel.settings read back as %+v; want %+v", got.Status.Kernel, settings)
		}
		// A list map: one entry per sysctl name.
		got.Status.Kernel.Settings = append(got.Status.Kernel.Settings, proxyv1alpha1.KernelSetting{Name: "net.ipv4.vs.conntrack", Want: "0"})
		if err := env.Client.Status().Update(ctx, got); err == nil {
			t.Error("a setting listed twice was accepted")
		}
	})
}

func clientKey(name string) client.ObjectKey { return client.ObjectKey{Name: name} }

// expectTable checks kubectl's table output: the header has exactly the
// given columns in order, and one row holds every given cell.
func expectTable(t *testing.T, out string, header, cells []string) {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if got := strings.Fields(lines[0]); strings.Join(got, " ") != strings.Join(header, " ") {
		t.Errorf("header: got %v, want %v\n%s", got, header, out)
	}
	for _, row := range lines[1:] {
		fields := strings.Fields(row)
		all := true
		for _, c := range cells {
			found := false
			for _, f := range fields {
				if f == c {
					found = true
				}
			}
			all = all && found
		}
		if all {
			return
		}
	}
	t.Errorf("no row holds all of %v:\n%s", cells, out)
}
