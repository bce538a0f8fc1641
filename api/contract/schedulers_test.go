package contract

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
)

func TestScheduler(t *testing.T) {
	if s, err := Scheduler(""); s != DefaultScheduler || err != nil {
		t.Errorf("Scheduler(\"\") = %q, %v; want the default", s, err)
	}
	if s, err := Scheduler("mh"); s != "mh" || err != nil {
		t.Errorf("Scheduler(mh) = %q, %v", s, err)
	}
	if _, err := Scheduler("fifo"); err == nil {
		t.Error("Scheduler(fifo) succeeded")
	}
	if !slices.Contains(Schedulers, DefaultScheduler) {
		t.Errorf("the default scheduler %s is not among %v", DefaultScheduler, Schedulers)
	}
}

// crdFields walks a CRD's schemas and returns, for each property named in
// fields, every schema of that name (one per version and place).
func crdFields(t *testing.T, file string, fields ...string) map[string][]map[string]any {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "..", "config", "crd", "bases", file))
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := yaml.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	out := map[string][]map[string]any{}
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			if props, ok := v["properties"].(map[string]any); ok {
				for name, p := range props {
					if s, ok := p.(map[string]any); ok && slices.Contains(fields, name) {
						out[name] = append(out[name], s)
					}
				}
			}
			for _, c := range v {
				walk(c)
			}
		case []any:
			for _, c := range v {
				walk(c)
			}
		}
	}
	walk(doc)
	return out
}

func enum(s map[string]any) []string {
	var out []string
	for _, v := range s["enum"].([]any) {
		out = append(out, v.(string))
	}
	return out
}

func strs[S ~string](in []S) []string {
	out := make([]string, len(in))
	for i, s := range in {
		out[i] = string(s)
	}
	return out
}

// TestCRDEnumsAreTheContract checks that the API server accepts exactly
// the modes and IPVS schedulers the contract lists, with its default
// scheduler: the generated CRDs (from the markers of api/v1alpha1, kept
// current by make verify) against Modes, Schedulers and DefaultScheduler.
func TestCRDEnumsAreTheContract(t *testing.T) {
	for _, c := range []struct {
		file   string
		modes  []string // the fields of type ProxyMode
		places int      // how many scheduler fields (one per ProxySettings)
	}{
		{"network.proxyshift.io_proxyconfigs.yaml", []string{"mode", "targetMode"}, 1},
		// spec.settings and status.activeSettings
		{"network.proxyshift.io_proxynodes.yaml", []string{"desiredMode", "activeMode"}, 2},
	} {
		fields := crdFields(t, c.file, append([]string{"scheduler"}, c.modes...)...)
		for _, f := range c.modes {
			if len(fields[f]) == 0 {
				t.Errorf("%s: no field %s", c.file, f)
			}
			for _, s := range fields[f] {
				if got := enum(s); !slices.Equal(got, strs(Targets)) {
					t.Errorf("%s: %s accepts %v; the contract's targets are %v", c.file, f, got, Targets)
				}
			}
		}
		if len(fields["scheduler"]) != c.places {
			t.Errorf("%s: %d scheduler fields, want %d", c.file, len(fields["scheduler"]), c.places)
		}
		for _, s := range fields["scheduler"] {
			if got := enum(s); !slices.Equal(got, strs(Schedulers)) {
				t.Errorf("%s: scheduler accepts %v; the contract's schedulers are %v", c.file, got, Schedulers)
			}
			if s["default"] != string(DefaultScheduler) {
				t.Errorf("%s: scheduler defaults to %v; the contract's default is %s", c.file, s["default"], DefaultScheduler)
			}
		}
	}
	for _, m := range []v1alpha1.ProxyMode{v1alpha1.ModeIPTables, v1alpha1.ModeNFTables, v1alpha1.ModeIPVS} {
		if !ValidMode(m) || !ValidTarget(m) {
			t.Errorf("the API's mode %s is not valid in the contract", m)
		}
	}
	if ValidMode(v1alpha1.ModeKubeProxy) || !ValidTarget(v1alpha1.ModeKubeProxy) {
		t.Errorf("kube-proxy must be a target and not one of proxyshift's modes")
	}
}
