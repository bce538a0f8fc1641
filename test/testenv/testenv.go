// Package testenv starts the real test control plane (kube-apiserver and
// etcd built by hack/controlplane.sh) through controller-runtime's envtest,
// with proxyshift's CRDs installed, so API-level tests never rest on a mock.
package testenv

import (
	"bytes"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	proxyv1alpha1 "github.com/proxyshift/proxyshift/api/v1alpha1"
)

// ServiceCIDR is the API server's service-cluster-ip-range: inside
// 198.18.0.0/15, the only range tests may send traffic to, and equal to
// netlab.ServiceCIDR.
const ServiceCIDR = "198.19.0.0/16"

// DualStackServiceCIDRs is the service-cluster-ip-range of
// StartDualStack: ServiceCIDR, then its IPv6 twin in the dual-stack lab
// (netlab.IPv6PrefixOf), so Services may be dual-stack
// (ipFamilyPolicy RequireDualStack) with IPv4 their primary family.
const DualStackServiceCIDRs = ServiceCIDR + ",2001:db8::c613:0/112"

// Env is a running API server with proxyshift's CRDs installed.
type Env struct {
	// Config reaches the API server as an administrator.
	Config *rest.Config
	// Client is a controller-runtime client with proxyshift's types.
	Client client.Client
	// Scheme knows the built-in kinds and proxyshift's.
	Scheme *runtime.Scheme
	// Kubeconfig is the path of a kubeconfig file for kubectl.
	Kubeconfig string
	// AssetsDir holds kube-apiserver, etcd and kubectl.
	AssetsDir string

	env *envtest.Environment
}

// RepoRoot is the repository's top directory.
func RepoRoot() string {
	_, file, _, _ := goruntime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// Start starts a control plane for the test and stops it when the test
// ends. It fails (never skips) when the control plane binaries are not
// there, naming the command that builds them.
func Start(t testing.TB) *Env {
	t.Helper()
	return start(t, ServiceCIDR)
}

// StartDualStack is Start with a dual-stack API server, whose
// service-cluster-ip-range is DualStackServiceCIDRs.
func StartDualStack(t testing.TB) *Env {
	t.Helper()
	return start(t, DualStackServiceCIDRs)
}

func start(t testing.TB, serviceCIDRs string) *Env {
	t.Helper()
	assets := os.Getenv("KUBEBUILDER_ASSETS")
	if assets == "" {
		t.Fatal("KUBEBUILDER_ASSETS is not set: run `make test`, or export KUBEBUILDER_ASSETS=$(hack/controlplane.sh)")
	}
	env, err := launch(assets, t.TempDir(), serviceCIDRs)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Errorf("stop test control plane: %v", err)
		}
	})
	return env
}

// Launch starts a control plane from the binaries in assets, writing its
// kubeconfig into dir, for programs that run outside a test (benchmarks);
// the caller stops it with Stop.
func Launch(assets, dir string) (*Env, error) { return launch(assets, dir, ServiceCIDR) }

// LaunchAdvertising is Launch with the API server advertising addr (its
// --advertise-address: the endpoint of the default/kubernetes Service)
// instead of 127.0.0.1, which no other network namespace can reach: a
// lab that answers on addr inside its node namespace lets the programs
// there reach the API server through that Service.
func LaunchAdvertising(assets, dir string, addr netip.Addr) (*Env, error) {
	return launch(assets, dir, ServiceCIDR, func(env *envtest.Environment) {
		env.ControlPlane.GetAPIServer().Configure().Set("advertise-address", addr.String())
	})
}

// launch starts the control plane; each configure function may set more
// flags of the API server before it starts (LaunchAudited).
func launch(assets, dir, serviceCIDRs string, configure ...func(*envtest.Environment)) (*Env, error) {
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return nil, err
	}
	if err := proxyv1alpha1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	env := &envtest.Environment{
		BinaryAssetsDirectory: assets,
		CRDDirectoryPaths:     []string{filepath.Join(RepoRoot(), "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
		Scheme:                scheme,
		// envtest's 20 s is too short for a graceful stop of the API
		// server on a loaded 2-core machine.
		ControlPlaneStopTimeout: time.Minute,
	}
	// Service IPs come from the test range, so that labs can route them.
	env.ControlPlane.GetAPIServer().Configure().Set("service-cluster-ip-range", serviceCIDRs)
	// A throwaway etcd need not wait for the disk on every write.
	env.ControlPlane.Etcd = &envtest.Etcd{}
	env.ControlPlane.Etcd.Configure().Set("unsafe-no-fsync", "true")
	for _, f := range configure {
		f(env)
	}
	cfg, err := env.Start()
	if err != nil {
		return nil, fmt.Errorf("start test control plane from %s: %w", assets, err)
	}
	e := &Env{Config: cfg, Scheme: scheme, AssetsDir: assets, env: env}
	if err := e.finish(dir); err != nil {
		_ = env.Stop()
		return nil, err
	}
	return e, nil
}

// finish builds the client and the administrator's kubeconfig.
func (e *Env) finish(dir string) error {
	c, err := client.New(e.Config, client.Options{Scheme: e.Scheme})
	if err != nil {
		return err
	}
	e.Client = c
	user, err := e.env.AddUser(envtest.User{Name: "test-admin", Groups: []string{"system:masters"}}, e.Config)
	if err != nil {
		return fmt.Errorf("create test admin: %w", err)
	}
	kubeconfig, err := user.KubeConfig()
	if err != nil {
		return err
	}
	e.Kubeconfig = filepath.Join(dir, "kubeconfig")
	return os.WriteFile(e.Kubeconfig, kubeconfig, 0o600)
}

// Stop stops the API server and etcd.
func (e *Env) Stop() error { return e.env.Stop() }

// Kubectl runs the control plane's kubectl against the API server and
// returns its stdout; stderr is included in the error.
func (e *Env) Kubectl(t testing.TB, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(filepath.Join(e.AssetsDir, "kubectl"), append([]string{"--kubeconfig", e.Kubeconfig}, args...)...)
	cmd.Dir = RepoRoot()
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), &KubectlError{Args: args, Err: err, Stderr: stderr.String()}
	}
	return stdout.String(), nil
}

// KubectlError is a failed kubectl run with its stderr.
type KubectlError struct {
	Args   []string
	Err    error
	Stderr string
}

func (e *KubectlError) Error() string {
	return "kubectl " + strings.Join(e.Args, " ") + ": " + e.Err.Error() + ": " + e.Stderr
}
