package facts

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/proxyshift/proxyshift/api/contract"
	"github.com/proxyshift/proxyshift/api/v1alpha1"
	"github.com/proxyshift/proxyshift/controllers/preflight"
	"github.com/proxyshift/proxyshift/nodeagent/kmod"
)

// crdSchedulers reads the IPVS schedulers the API server accepts in a
// ProxyConfig: the enum of spec.ipvs.scheduler in the generated
// CRD, not the Go list, so that a scheduler added to the API markers
// alone fails here.
func crdSchedulers(t *testing.T) []v1alpha1.IPVSScheduler {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "..", "config", "crd", "bases", "network.proxyshift.io_proxyconfigs.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var crd struct {
		Spec struct {
			Versions []struct {
				Schema struct {
					OpenAPIV3Schema map[string]any `json:"openAPIV3Schema"`
				} `json:"schema"`
			} `json:"versions"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(data, &crd); err != nil {
		t.Fatal(err)
	}
	var out []v1alpha1.IPVSScheduler
	for _, v := range crd.Spec.Versions {
		node := any(v.Schema.OpenAPIV3Schema)
		for _, field := range []string{"spec", "ipvs", "scheduler"} {
			props, _ := node.(map[string]any)["properties"].(map[string]any)
			node = props[field]
			if node == nil {
				t.Fatalf("the CRD has no field %s on the way to spec.ipvs.scheduler", field)
			}
		}
		for _, s := range node.(map[string]any)["enum"].([]any) {
			out = append(out, v1alpha1.IPVSScheduler(s.(string)))
		}
	}
	if len(out) == 0 {
		t.Fatal("the CRD's scheduler field has no enum")
	}
	return out
}

// kernelWith is a kernel whose modules.builtin lists exactly mods, with
// nothing loaded.
func kernelWith(t *testing.T, mods []string) *kmod.Kernel {
	t.Helper()
	dir := t.TempDir()
	var b strings.Builder
	for _, m := range mods {
		b.WriteString("kernel/" + m + ".ko\n")
	}
	for p, c := range map[string]string{"modules.builtin": b.String(), "modules.dep": "", "proc-modules": ""} {
		if err := os.WriteFile(filepath.Join(dir, p), []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return &kmod.Kernel{ModulesDir: dir, ProcModules: filepath.Join(dir, "proc-modules"), SysModule: t.TempDir()}
}

// TestEverySchedulerPassesPreflight closes the loop between the API, the
// agent and the operator for every scheduler a ProxyConfig may ask for:
// the facts the agent gathers on a kernel that has every scheduler report
// that scheduler's module, and the operator's preflight finds nothing
// missing; on a kernel without one scheduler's module, preflight names
// that module as Missing (a state the agent reported), never as "not
// reported", and every other scheduler still passes.
func TestEverySchedulerPassesPreflight(t *testing.T) {
	schedulers := crdSchedulers(t)
	if !slices.Equal(schedulers, contract.Schedulers) {
		t.Errorf("the CRD accepts the schedulers %v; the contract lists %v", schedulers, contract.Schedulers)
	}
	var all []string
	for _, s := range schedulers {
		mods, err := contract.ModulesFor(v1alpha1.ModeIPVS, s)
		if err != nil {
			t.Fatalf("scheduler %s: %v", s, err)
		}
		all = append(all, mods...)
	}
	noIPTables := func(context.Context) []v1alpha1.IPTablesBackend { return nil }
	settings := func(s v1alpha1.IPVSScheduler) *v1alpha1.ProxySettings {
		return &v1alpha1.ProxySettings{IPVS: &v1alpha1.IPVSSettings{Scheduler: s}}
	}

	g := &Gatherer{Kernel: kernelWith(t, all), IPTables: noIPTables}
	f := g.Gather(context.Background())
	for _, s := range schedulers {
		if p := preflight.Problems(v1alpha1.ModeIPVS, settings(s), &f); len(p) > 0 {
			t.Errorf("scheduler %s on a kernel with every module: preflight says %q", s, p)
		}
	}

	for _, gone := range schedulers {
		missing := contract.SchedulerModule(gone)
		g := &Gatherer{Kernel: kernelWith(t, slices.DeleteFunc(slices.Clone(all), func(m string) bool { return m == missing })), IPTables: noIPTables}
		f := g.Gather(context.Background())
		for _, s := range schedulers {
			p := preflight.Problems(v1alpha1.ModeIPVS, settings(s), &f)
			want := []string(nil)
			if s == gone {
				want = []string{"kernel module " + missing + " is " + string(v1alpha1.ModuleMissing)}
			}
			if !slices.Equal(p, want) {
				t.Errorf("scheduler %s on a kernel without %s: preflight says %q, want %q", s, missing, p, want)
			}
		}
	}
}
