package dataplane_test

import (
	"fmt"
	"os/exec"
	"strings"
	"testing"

	"github.com/proxyshift/proxyshift/nodeagent/dataplane"
	"github.com/proxyshift/proxyshift/nodeagent/dataplane/iptables"
	"github.com/proxyshift/proxyshift/test/netlab"
)

// The iptables backend's rows, one per iptables variant. The helpers run
// the variant's own command-line tools inside the node namespace (not the
// backend's code), and read or damage only proxyshift's chains.

// iptablesRow is the suite row of one iptables variant.
func iptablesRow(v iptables.Variant) backend {
	return backend{
		name: "iptables-" + string(v),
		skip: func(t *testing.T, _ *netlab.NetNS) {
			t.Helper()
			for _, cmd := range []string{"restore", "save"} {
				name := "iptables-" + string(v) + "-" + cmd
				if _, err := lookSbin(name); err != nil {
					t.Skipf("needs %s (Debian package iptables): %v", name, err)
				}
			}
		},
		new: func(t *testing.T, node *netlab.NetNS, cfg dataplane.NodeConfig) dataplane.Backend {
			t.Helper()
			b, err := iptables.New(cfg, iptables.WithVariant(v), iptables.WithNetNS(node.NS()))
			if err != nil {
				t.Fatalf("iptables.New: %v", err)
			}
			return b
		},
		drift: func(t *testing.T, node *netlab.NetNS, fam ipFamily) { iptablesDrift(t, node, v, fam) },
		dump: func(node *netlab.NetNS) string {
			var dump strings.Builder
			for _, fam := range []ipFamily{ipv4, ipv6} {
				out, err := familyCmd(node, fam, v, "save")
				if err != nil {
					out = err.Error() + "\n"
				}
				dump.WriteString(out)
			}
			return dump.String()
		},
	}
}

// lookSbin finds a command in $PATH or in /usr/sbin and /sbin.
func lookSbin(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	for _, dir := range []string{"/usr/sbin/", "/sbin/"} {
		if p, err := exec.LookPath(dir + name); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s not found in $PATH, /usr/sbin or /sbin", name)
}

// iptablesCmd runs iptables-<variant>[-tool] with args in node and returns
// its output.
func iptablesCmd(node *netlab.NetNS, v iptables.Variant, tool string, args ...string) (string, error) {
	return familyCmd(node, ipv4, v, tool, args...)
}

// familyCmd runs the command of family fam, iptables-<variant>[-tool] or
// ip6tables-<variant>[-tool], with args in node and returns its output.
func familyCmd(node *netlab.NetNS, fam ipFamily, v iptables.Variant, tool string, args ...string) (string, error) {
	name := "iptables-" + string(v)
	if fam.model == ipv6.model {
		name = "ip6tables-" + string(v)
	}
	if tool != "" {
		name += "-" + tool
	}
	path, err := lookSbin(name)
	if err != nil {
		return "", err
	}
	var out []byte
	err = node.Do(func() error {
		var err error
		out, err = exec.Command(path, args...).CombinedOutput()
		return err
	})
	if err != nil {
		return "", fmt.Errorf("%s %s: %v: %s", name, strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// iptablesDrift damages the programmed rules of family fam as an
// administrator might: it deletes the jump from nat PREROUTING into
// proxyshift's chains (the backend inserted it first) and flushes the
// chain of service web.
func iptablesDrift(t *testing.T, node *netlab.NetNS, v iptables.Variant, fam ipFamily) {
	t.Helper()
	out, err := familyCmd(node, fam, v, "", "-t", "nat", "-S", "PREROUTING", "1")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "-j "+iptables.ChainPrefix) {
		t.Fatalf("first rule of nat PREROUTING is not proxyshift's jump: %q", out)
	}
	if _, err := familyCmd(node, fam, v, "", "-t", "nat", "-D", "PREROUTING", "1"); err != nil {
		t.Fatal(err)
	}
	saved, err := familyCmd(node, fam, v, "save", "-t", "nat")
	if err != nil {
		t.Fatal(err)
	}
	web := ""
	for _, l := range strings.Split(saved, "\n") {
		if strings.Contains(l, `"suite/web:p/TCP cluster IP"`) {
			f := strings.Fields(l)
			web = f[len(f)-1]
		}
	}
	if !strings.HasPrefix(web, iptables.ChainPrefix) {
		t.Fatalf("no chain of service web in nat:\n%s", saved)
	}
	if _, err := familyCmd(node, fam, v, "", "-t", "nat", "-F", web); err != nil {
		t.Fatal(err)
	}
}
