// Package startup_test builds the operator binary and runs it against a real
// API server: it must win leader election, serve health, and serve metrics
// over HTTPS to callers the API server authenticates and authorizes only.
package startup_test

import (
	"context"
	"crypto/tls"
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

	authenticationv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
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
	checkMetricsAuth(t, env, "https://"+metrics+"/metrics")

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

// checkMetricsAuth checks the operator's metrics endpoint the way a
// Prometheus in the cluster reaches it: no token is 401, a token whose
// ServiceAccount lacks the proxyshift-metrics-reader ClusterRole is 403,
// and one bound to it gets the metrics. The tokens are TokenRequest tokens
// of two ServiceAccounts; the role is config/rbac's.
func checkMetricsAuth(t *testing.T, env *testenv.Env, url string) {
	t.Helper()
	ctx := context.Background()
	if out, err := env.Kubectl(t, "apply", "-f", "config/rbac/metrics_reader_role.yaml"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	kube := kubernetes.NewForConfigOrDie(env.Config)
	token := func(sa string) string {
		if _, err := kube.CoreV1().ServiceAccounts("default").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		tr, err := kube.CoreV1().ServiceAccounts("default").CreateToken(ctx, sa, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return tr.Status.Token
	}
	scraper, stranger := token("prometheus"), token("stranger")
	if _, err := kube.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "prometheus-proxyshift-metrics"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "proxyshift-metrics-reader"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: "prometheus", Namespace: "default"}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// The endpoint's certificate is self-signed (no --metrics-cert-dir):
	// what is checked here is who may read, not the certificate.
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	get := func(tok string) (int, string) {
		req, err := http.NewRequest(http.MethodGet, url, nil)
		if err != nil {
			t.Fatal(err)
		}
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		resp, err := hc.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	// The server starts a moment after the probes answer, and the new
	// binding reaches the API server's RBAC cache a moment after it is
	// written: poll for each settled answer.
	expect := func(who, tok string, want int) string {
		deadline := time.Now().Add(30 * time.Second)
		for {
			code, body := get(tok)
			if code == want {
				t.Logf("%s: HTTP %d", who, code)
				return body
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: GET %s answered %d (%.300s); want %d", who, url, code, body, want)
			}
			time.Sleep(250 * time.Millisecond)
		}
	}
	expect("no token", "", http.StatusUnauthorized)
	expect("a token without the metrics-reader role", stranger, http.StatusForbidden)
	if body := expect("a token with the metrics-reader role", scraper, http.StatusOK); !strings.Contains(body, "controller_runtime_") {
		t.Errorf("metrics endpoint lacks controller-runtime metrics:\n%.500s", body)
	}
	if code, _ := get(""); code != http.StatusUnauthorized {
		t.Errorf("no token after the role was bound: HTTP %d, want 401", code)
	}
	if code, body := hcPlain(url); code == http.StatusOK || strings.Contains(body, "controller_runtime_") {
		t.Errorf("plain HTTP on the metrics port answered %d: %.200s", code, body)
	}
}

// hcPlain tries url over plain HTTP (0: no answer at all).
func hcPlain(url string) (int, string) {
	resp, err := http.Get(strings.Replace(url, "https://", "http://", 1))
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
