package backends

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/proxyshift/proxyshift/api/contract"
	"github.com/proxyshift/proxyshift/api/v1alpha1"
	"github.com/proxyshift/proxyshift/nodeagent/dataplane/ipvs"
	"github.com/proxyshift/proxyshift/nodeagent/nsexec"
)

func TestEveryModeHasAFactory(t *testing.T) {
	f := Factories(Env{NS: nsexec.Current})
	for _, m := range contract.Modes {
		if f[m] == nil {
			t.Errorf("no factory for mode %s", m)
		}
	}
	if len(f) != len(contract.Modes) {
		t.Errorf("%d factories for %d modes", len(f), len(contract.Modes))
	}
	if ipvs.DefaultScheduler != string(contract.DefaultScheduler) {
		t.Errorf("the ipvs backend defaults to %s, the contract to %s", ipvs.DefaultScheduler, contract.DefaultScheduler)
	}
}

func TestIPVSOptionsRefusesWhatTheContractRefuses(t *testing.T) {
	if _, err := IPVSOptions(&v1alpha1.IPVSSettings{UDPTimeout: "1500ms"}); err == nil {
		t.Error("a timeout IPVS cannot hold was accepted")
	}
	opts, err := IPVSOptions(&v1alpha1.IPVSSettings{Scheduler: "mh"})
	if err != nil || len(opts) != 4 {
		t.Errorf("IPVSOptions(mh) = %d options, %v; want scheduler, strict ARP, timeouts, excluded CIDRs", len(opts), err)
	}
}

// TestDataplaneKnowsNothingOfTheAPI checks that no package under
// nodeagent/dataplane depends on the API, directly or through another
// package of the module: the backends take plain options, and this
// package is where the API's settings become those options.
func TestDataplaneKnowsNothingOfTheAPI(t *testing.T) {
	var dirs []string
	err := filepath.WalkDir(filepath.Join(moduleRoot, "nodeagent", "dataplane"), func(p string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() && d.Name() != "testdata" {
			rel, _ := filepath.Rel(moduleRoot, p)
			dirs = append(dirs, rel)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if seen := checkImports(t, dirs, func(sub string) bool { return strings.HasPrefix(sub, "api/") }); seen < 5 {
		t.Errorf("only %d packages looked at", seen)
	}
}

// TestFactoriesLoadNoModule checks that the factories cannot load a
// kernel module: nothing they build reaches kmod. The agent builds every
// mode's backend from its start, on every node, to look at what the
// kernel holds; a module loaded there would change the node at install
// (the switch's Preparing loads its target's modules).
func TestFactoriesLoadNoModule(t *testing.T) {
	checkImports(t, []string{filepath.Join("nodeagent", "backends")}, func(sub string) bool { return sub == "nodeagent/kmod" })
}

// moduleRoot is the module's directory, from this package's.
var moduleRoot = filepath.Join("..", "..")

// checkImports fails t for every import of a forbidden package (by path
// within the module) by the packages in dirs, directly or through other
// packages of the module, and returns how many packages it looked at.
func checkImports(t *testing.T, dirs []string, forbidden func(sub string) bool) int {
	t.Helper()
	const module = "github.com/proxyshift/proxyshift/"
	var check func(dir string, path []string)
	seen := map[string]bool{}
	check = func(dir string, path []string) {
		if seen[dir] {
			return
		}
		seen[dir] = true
		files, err := filepath.Glob(filepath.Join(moduleRoot, dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			ast, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.ImportsOnly)
			if err != nil {
				t.Fatal(err)
			}
			for _, imp := range ast.Imports {
				p, _ := strconv.Unquote(imp.Path.Value)
				if !strings.HasPrefix(p, module) {
					continue
				}
				sub := strings.TrimPrefix(p, module)
				if forbidden(sub) {
					t.Errorf("%s imports %s (through %v)", f, p, path)
					continue
				}
				check(sub, append(path, sub))
			}
		}
	}
	for _, dir := range dirs {
		check(dir, []string{dir})
	}
	return len(seen)
}
