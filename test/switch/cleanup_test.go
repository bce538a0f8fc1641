package switchtest

import (
	"context"
	"os/exec"
	"strings"
	"testing"

	gnft "github.com/google/nftables"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
)

// TestCleanupCommand: `proxyshift-agent --cleanup` removes everything
// proxyshift owns from the node, wherever it is (the iptables variant the
// agent used, stale chains in the other variant, an nftables table left
// by an earlier nftables run, an ipset), says what it removed, and leaves
// other programs' objects alone. A stopped agent leaves its rules in
// place (they keep serving) until then.
func TestCleanupCommand(t *testing.T) {
	w := newWorld(t, v1alpha1.ModeIPTables)
	a := w.startAgent()
	w.waitActive(v1alpha1.ModeIPTables)
	a.stop()
	if has, _ := w.holds(v1alpha1.ModeIPTables); !has {
		t.Fatal("stopping the agent removed its rules")
	}
	w.requireTraffic()

	// Leftovers in other places, and objects that are not proxyshift's.
	ns := w.lab.Node.NS.NS()
	for bin, input := range map[string]string{
		"iptables-legacy-restore": "*nat\n:PROXYSHIFT-OLD - [0:0]\n:MY-CHAIN - [0:0]\n-A PREROUTING -j PROXYSHIFT-OLD\n-A PREROUTING -j MY-CHAIN\nCOMMIT\n",
	} {
		if _, err := ns.Output(context.Background(), []byte(input), bin, "--noflush"); err != nil {
			t.Fatalf("%s: %v", bin, err)
		}
	}
	c, err := gnft.New(gnft.WithNetNSFd(w.lab.Node.NS.FD()))
	if err != nil {
		t.Fatal(err)
	}
	c.AddTable(&gnft.Table{Name: "mine", Family: gnft.TableFamilyIPv6})
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	// An earlier nftables run's table carries proxyshift's ownership mark.
	if _, err := ns.Output(context.Background(), nil, "nft", "add table ip6 proxyshift { comment \"managed by proxyshift\"; }"); err != nil {
		t.Fatalf("nft: %v", err)
	}

	out, err := exec.Command(agentBin, "--cleanup", "--netns", w.lab.Node.NS.Name, "--node-name", nodeName).CombinedOutput()
	if err != nil {
		t.Fatalf("--cleanup: %v\n%s", err, out)
	}
	t.Logf("--cleanup said:\n%s", out)
	for _, want := range []string{"PROXYSHIFT-SERVICES", "PROXYSHIFT-OLD", "nftables table ip6 proxyshift"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("--cleanup did not report removing %s", want)
		}
	}
	for _, m := range []v1alpha1.ProxyMode{v1alpha1.ModeIPTables, v1alpha1.ModeNFTables} {
		if has, dump := w.holds(m); has {
			t.Errorf("%s objects left after --cleanup:\n%s", m, dump)
		}
	}
	save := w.iptablesSave()
	if !strings.Contains(save, "-A PREROUTING -j MY-CHAIN") {
		t.Errorf("--cleanup removed a chain that is not proxyshift's:\n%s", save)
	}
	found := false
	for _, o := range w.nftObjects() {
		found = found || o == "ip6 mine"
	}
	if !found {
		t.Errorf("--cleanup removed an nftables table that is not proxyshift's: %v", w.nftObjects())
	}

	out, err = exec.Command(agentBin, "--cleanup", "--netns", w.lab.Node.NS.Name, "--node-name", nodeName).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "nothing of proxyshift's was found") {
		t.Errorf("second --cleanup: %v\n%s", err, out)
	}
}
