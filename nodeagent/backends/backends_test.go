package backends

import (
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/proxyshift/proxyshift/api/contract"
	"github.com/proxyshift/proxyshift/api/v1alpha1"
	"github.com/proxyshift/proxyshift/nodeagent/dataplane"
	"github.com/proxyshift/proxyshift/nodeagent/dataplane/ipvs"
	"github.com/proxyshift/proxyshift/nodeagent/nsexec"
	"github.com/proxyshift/proxyshift/test/netlab"
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

// factoriesChild, set in the environment, makes
// TestFactoriesRunNoModprobe the child process that builds the backends.
const factoriesChild = "PROXYSHIFT_FACTORIES_CHILD"

// TestFactoriesRunNoModprobe builds every mode's backend, as the agent's
// start does, with a modprobe first on PATH that records its calls: none
// may come. moby/ipvs runs `modprobe ip_vs` when a process opens its
// first IPVS handle, so the ipvs factory must not open one on a kernel
// without IPVS (the agent image has no modprobe, but a node's may). The
// backends are built in a child process, where moby/ipvs has opened
// nothing yet.
func TestFactoriesRunNoModprobe(t *testing.T) {
	if os.Getenv(factoriesChild) != "" {
		ns := netlab.NewNetNS(t, "factories")
		for mode, build := range Factories(Env{NS: ns.NS()}) {
			_, err := build(dataplane.NodeConfig{NodeName: "node", MasqueradeBit: 14}, v1alpha1.ProxySettings{})
			t.Logf("%s: %v", mode, err)
			if mode == v1alpha1.ModeIPVS && (err == nil || !strings.Contains(err.Error(), "ip_vs is not loaded")) {
				t.Errorf("ipvs backend on a kernel without IPVS: %v; want an error saying ip_vs is not loaded", err)
			}
		}
		return
	}
	netlab.RequireRoot(t)
	if _, err := netlink.GenlFamilyGet("IPVS"); err == nil {
		t.Skip("needs a kernel without IPVS loaded: the check is that building the backends loads nothing")
	}
	dir := t.TempDir()
	calls := filepath.Join(dir, "calls")
	if err := os.WriteFile(filepath.Join(dir, "modprobe"), []byte("#!/bin/sh\necho \"modprobe $*\" >> "+calls+"\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestFactoriesRunNoModprobe$", "-test.v")
	cmd.Env = append(os.Environ(), factoriesChild+"=1", "PATH="+dir+":"+os.Getenv("PATH"))
	out, err := cmd.CombinedOutput()
	if got, err := os.ReadFile(calls); err == nil {
		t.Errorf("building the backends ran: %s", got)
	}
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "ipvs: ") {
		t.Fatalf("the child built no ipvs backend:\n%s", out)
	}
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
