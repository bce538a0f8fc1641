package ipvs

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/proxyshift/proxyshift/nodeagent/dataplane"
)

// TestProcSysDirectory sets and reads the sysctls under the directory
// WithProcSys names, as an unprivileged agent does through the host's
// /proc/sys/net mounted read-write (a plain directory here), and not
// under /proc/sys.
func TestProcSysDirectory(t *testing.T) {
	dir := t.TempDir()
	b := &Backend{strictARP: true}
	WithProcSys(dir)(b)
	want := b.settings(kernelRelease())
	if len(want) == 0 {
		t.Fatal("no settings")
	}
	for _, s := range want {
		p := filepath.Join(dir, strings.ReplaceAll(s.Name, ".", "/"))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("7\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.setSysctls(); err != nil {
		t.Fatal(err)
	}
	got, err := b.KernelSettings()
	if err != nil {
		t.Fatal(err)
	}
	for i, s := range want {
		if got[i].Name != s.Name || got[i].Value != s.Want {
			t.Errorf("%s: read %q back from %s, want %q", s.Name, got[i].Value, dir, s.Want)
		}
	}
	if p := dataplane.SysctlPath("", "net.ipv4.vs.conntrack"); p != "/proc/sys/net/ipv4/vs/conntrack" {
		t.Errorf("default path %s", p)
	}
}
