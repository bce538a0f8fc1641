package plugin

import (
	"bytes"
	"context"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"sigs.k8s.io/yaml"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
	"github.com/proxyshift/proxyshift/test/testenv"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// golden compares got with testdata/name, or rewrites it with -update.
func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if got != string(want) {
		t.Errorf("output differs from %s (rerun with -update after checking):\n--- got\n%s--- want\n%s", path, got, want)
	}
}

// syncBuffer is an output stream the watch writes to while the test reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestPluginAgainstAPIServer runs the plugin's commands, as kubectl runs
// the binary (with --kubeconfig), against a real API server holding a
// rollout half way through: one node done, one failed, one not asked.
func TestPluginAgainstAPIServer(t *testing.T) {
	env := testenv.Start(t)
	ctx := context.Background()
	c := env.Client

	cfg := &v1alpha1.ProxyConfig{ObjectMeta: metav1.ObjectMeta{Name: "to-nftables"}, Spec: v1alpha1.ProxyConfigSpec{Mode: v1alpha1.ModeNFTables}}
	if err := c.Create(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	// Ages are measured from the config's creation, ten hours later.
	now := cfg.CreationTimestamp.Add(10 * time.Hour)
	synced := metav1.NewTime(now.Add(-90 * time.Second))
	cfg.Status = v1alpha1.ProxyConfigStatus{
		Phase: v1alpha1.RolloutFailed, TargetMode: v1alpha1.ModeNFTables, Selector: "pool=web",
		Nodes:       v1alpha1.NodeCounts{Selected: 2, Updated: 1, Ready: 1, Failed: 1, Summary: "1/2"},
		FailedNodes: []v1alpha1.FailedNode{{Name: "node-b", Reason: "Verifying failed: 198.19.0.10:80 did not answer"}},
		Conditions: []metav1.Condition{{Type: v1alpha1.ConditionReady, Status: metav1.ConditionFalse, Reason: "NodeFailed",
			Message: "node-b failed; rolled back to iptables", LastTransitionTime: metav1.Now()}},
	}
	if err := c.Status().Update(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	ref := &v1alpha1.ConfigReference{Name: "to-nftables", Generation: cfg.Generation}
	nodes := []struct {
		name   string
		spec   v1alpha1.ProxyNodeSpec
		status v1alpha1.ProxyNodeStatus
	}{
		{"node-a", v1alpha1.ProxyNodeSpec{DesiredMode: v1alpha1.ModeNFTables, ConfigRef: ref}, v1alpha1.ProxyNodeStatus{
			ActiveMode: v1alpha1.ModeNFTables, Phase: v1alpha1.NodeActive, LastSyncTime: &synced,
			Counts:     &v1alpha1.RuleCounts{Services: 12, Endpoints: 30, Rules: 87},
			Conditions: []metav1.Condition{{Type: v1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: "Synced", LastTransitionTime: metav1.Now()}},
		}},
		{"node-b", v1alpha1.ProxyNodeSpec{DesiredMode: v1alpha1.ModeIPTables, ConfigRef: ref}, v1alpha1.ProxyNodeStatus{
			ActiveMode: v1alpha1.ModeIPTables, Phase: v1alpha1.NodeFailed,
			Conditions: []metav1.Condition{{Type: v1alpha1.ConditionReady, Status: metav1.ConditionFalse, Reason: "VerifyFailed",
				Message: "198.19.0.10:80 did not answer\nsecond line", LastTransitionTime: metav1.Now()}},
		}},
		{"node-c", v1alpha1.ProxyNodeSpec{}, v1alpha1.ProxyNodeStatus{Phase: v1alpha1.NodeIdle}},
		{"node-d", v1alpha1.ProxyNodeSpec{}, v1alpha1.ProxyNodeStatus{ActiveMode: v1alpha1.ModeKubeProxy, KubeProxyMode: v1alpha1.ModeIPVS,
			Phase: v1alpha1.NodeActive}},
	}
	for _, n := range nodes {
		pn := &v1alpha1.ProxyNode{ObjectMeta: metav1.ObjectMeta{Name: n.name}, Spec: n.spec}
		if err := c.Create(ctx, pn); err != nil {
			t.Fatal(err)
		}
		pn.Status = n.status
		if err := c.Status().Update(ctx, pn); err != nil {
			t.Fatal(err)
		}
	}

	run := func(t *testing.T, args ...string) (string, error) {
		t.Helper()
		var out bytes.Buffer
		cmd := newCommand(genericiooptions.IOStreams{Out: &out, ErrOut: &out}, func() time.Time { return now })
		cmd.SetArgs(append(args, "--kubeconfig", env.Kubeconfig))
		err := cmd.ExecuteContext(ctx)
		return out.String(), err
	}

	t.Run("status", func(t *testing.T) {
		out, err := run(t, "status")
		if err != nil {
			t.Fatal(err)
		}
		golden(t, "status.txt", out)
		named, err := run(t, "status", "to-nftables")
		if err != nil || named != out {
			t.Errorf("status to-nftables: %v\n%s\nwant what status printed", err, named)
		}
	})
	t.Run("nodes", func(t *testing.T) {
		out, err := run(t, "nodes")
		if err != nil {
			t.Fatal(err)
		}
		golden(t, "nodes.txt", out)
	})
	t.Run("status -o yaml", func(t *testing.T) {
		out, err := run(t, "status", "-o", "yaml")
		if err != nil {
			t.Fatal(err)
		}
		var list struct {
			Kind  string
			Items []struct {
				Kind     string
				Metadata struct{ Name string }
			}
		}
		if err := yaml.Unmarshal([]byte(out), &list); err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, it := range list.Items {
			got = append(got, it.Kind+"/"+it.Metadata.Name)
		}
		if list.Kind != "List" || strings.Join(got, " ") != "ProxyConfig/to-nftables ProxyNode/node-a ProxyNode/node-b" {
			t.Errorf("-o yaml: kind %s items %v; want a List of the config and the nodes it asked", list.Kind, got)
		}
		if _, err := run(t, "nodes", "-o", "table"); err == nil || !strings.Contains(err.Error(), "want json or yaml") {
			t.Errorf("-o table: %v, want an error naming the formats", err)
		}
	})
	t.Run("pause and resume", func(t *testing.T) {
		for _, step := range []struct {
			verb string
			want bool
		}{{"pause", true}, {"resume", false}} {
			out, err := run(t, step.verb, "to-nftables")
			if err != nil || !strings.Contains(out, "proxyconfig/to-nftables "+step.verb+"d") {
				t.Fatalf("%s: %v %q", step.verb, err, out)
			}
			got := &v1alpha1.ProxyConfig{}
			if err := c.Get(ctx, types.NamespacedName{Name: "to-nftables"}, got); err != nil {
				t.Fatal(err)
			}
			if got.Spec.Rollout.Paused != step.want || got.Spec.Mode != v1alpha1.ModeNFTables {
				t.Errorf("after %s: paused %v mode %s, want paused %v and the mode kept", step.verb, got.Spec.Rollout.Paused, got.Spec.Mode, step.want)
			}
		}
		if _, err := run(t, "pause", "no-such-config"); err == nil || !strings.Contains(err.Error(), `"no-such-config" not found`) {
			t.Errorf("pause of a missing config: %v, want not found", err)
		}
	})
	t.Run("status --watch", func(t *testing.T) {
		out := &syncBuffer{}
		wctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() {
			cmd := newCommand(genericiooptions.IOStreams{Out: out, ErrOut: out}, func() time.Time { return now })
			cmd.SetArgs([]string{"status", "to-nftables", "--watch", "--kubeconfig", env.Kubeconfig})
			done <- cmd.ExecuteContext(wctx)
		}()
		waitFor := func(what string, cond func(string) bool) {
			t.Helper()
			deadline := time.Now().Add(30 * time.Second)
			for !cond(out.String()) {
				if time.Now().After(deadline) {
					cancel()
					t.Fatalf("timed out waiting for %s; output:\n%s", what, out.String())
				}
				time.Sleep(50 * time.Millisecond)
			}
		}
		waitFor("the first picture", func(s string) bool { return strings.Contains(s, "node-b  iptables") })
		pn := &v1alpha1.ProxyNode{}
		if err := c.Get(ctx, types.NamespacedName{Name: "node-b"}, pn); err != nil {
			t.Fatal(err)
		}
		pn.Status.Phase = v1alpha1.NodeProgramming
		if err := c.Status().Update(ctx, pn); err != nil {
			t.Fatal(err)
		}
		waitFor("a second picture with node-b Programming", func(s string) bool {
			return strings.Count(s, "--- ") == 2 && strings.Contains(s, "Programming")
		})
		cancel()
		if err := <-done; err != nil {
			t.Errorf("watch ended with %v", err)
		}
	})
}
