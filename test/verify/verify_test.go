// Package verify_test checks that `hack/verify.sh` (make verify) catches
// stale generated files, on a copy of the repository so the real work tree
// is never touched.
package verify_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/proxyshift/proxyshift/test/testenv"
)

// copyRepo copies the repository's tracked and unignored files to a
// temporary directory.
func copyRepo(t *testing.T) string {
	t.Helper()
	root := testenv.RepoRoot()
	list := exec.Command("git", "ls-files", "--cached", "--others", "--exclude-standard", "-z")
	list.Dir = root
	out, err := list.Output()
	if err != nil {
		t.Fatalf("git ls-files: %v", err)
	}
	dst := t.TempDir()
	for _, f := range strings.Split(strings.TrimRight(string(out), "\x00"), "\x00") {
		data, err := os.ReadFile(filepath.Join(root, f))
		if os.IsNotExist(err) {
			continue // deleted in the work tree, not yet in git
		}
		if err != nil {
			t.Fatal(err)
		}
		info, err := os.Stat(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dst, f)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dst, f), data, info.Mode().Perm()); err != nil {
			t.Fatal(err)
		}
	}
	return dst
}

func runVerify(dir string) (string, error) {
	cmd := exec.Command("bash", "hack/verify.sh", "generated")
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func TestVerifyCatchesHandEditedCRD(t *testing.T) {
	dir := copyRepo(t)
	if out, err := runVerify(dir); err != nil {
		t.Fatalf("verify fails on the repository as it is (run make manifests generate): %v\n%s", err, out)
	}

	crd := filepath.Join(dir, "config", "crd", "bases", "network.proxyshift.io_proxyconfigs.yaml")
	orig, err := os.ReadFile(crd)
	if err != nil {
		t.Fatal(err)
	}
	edited := strings.Replace(string(orig), "maximum: 31", "maximum: 63", 1)
	if edited == string(orig) {
		t.Fatal("test fixture drifted: the CRD no longer holds 'maximum: 31' for masqueradeBit")
	}
	if err := os.WriteFile(crd, []byte(edited), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := runVerify(dir)
	if err == nil {
		t.Fatalf("verify passed with a hand-edited CRD:\n%s", out)
	}
	if !strings.Contains(out, "generated files are stale") || !strings.Contains(out, "maximum: 63") {
		t.Errorf("verify's message does not show the stale file and change:\n%s", out)
	}
	// verify reports; it must leave the hand edit in place.
	after, err := os.ReadFile(crd)
	if err != nil {
		t.Fatal(err)
	}
	if string(after) != edited {
		t.Error("verify changed the work tree; it must only report")
	}
}
