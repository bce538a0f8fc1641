// Package startup_test builds the operator binary and runs it against a real
// API server: it must win leader election and serve health and metrics.
package startup_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/proxyshift/proxyshift/test/testenv"
)

// freeAddr returns a loopback address with a port nobody listens on.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// buildBinary builds ./cmd/<name> into a temporary directory.
func buildBinary(t *testing.T, name string) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), name)
	cmd := exec.Command("go", "build", "-o", out, "./cmd/"+name)
	cmd.Dir = testenv.RepoRoot()
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/%s: %v\n%s", name, err, b)
	}
	return out
}

// waitHTTP polls url until it answers 200 and returns the body.
func waitHTTP(t *testing.T, url string, timeout time.Duration) string {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var last string
	for time.Now().Before(deadline) {
		resp, err := http.Get(url)
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return string(body)
			}
			last = fmt.Sprintf("HTTP %d: %s", resp.StatusCode, body)
		} else {
			last = err.Error()
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("%s did not answer 200 within %s: %s", url, timeout, last)
	return ""
}

func TestOperatorStartsWithLeaderElectionHealthAndMetrics(t *testing.T) {
	env := testenv.Start(t)
	bin := buildBinary(t, "operator")
	metrics, probes := freeAddr(t), freeAddr(t)
	logFile, err := os.Create(filepath.Join(t.TempDir(), "operator.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--kubeconfig", env.Kubeconfig, "--leader-elect", "--leader-election-namespace", "default",
		"--metrics-bind-address", metrics, "--health-probe-bind-address", probes)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			b, _ := os.ReadFile(logFile.Name())
			t.Logf("operator log:\n%s", b)
		}
	})

	waitHTTP(t, "http://"+probes+"/healthz", 30*time.Second)
	waitHTTP(t, "http://"+probes+"/readyz", 30*time.Second)
	if body := waitHTTP(t, "http://"+metrics+"/metrics", 30*time.Second); !strings.Contains(body, "controller_runtime_") {
		t.Errorf("metrics endpoint lacks controller-runtime metrics:\n%.500s", body)
	}

	lease := &coordinationv1.Lease{}
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: "default", Name: "proxyshift-operator.proxyshift.io"}, lease)
		if err == nil && lease.Spec.HolderIdentity != nil && *lease.Spec.HolderIdentity != "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("operator did not take the leader election Lease: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
