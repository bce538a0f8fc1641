package vm

import (
	"os"
	"testing"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// KubeconfigEnvVar names the administrator's kubeconfig of the host's API
// server, set by the VM's /init for the packages that hack/vm/packages.txt
// marks "apiserver" (see hack/vm/README.md).
const KubeconfigEnvVar = "PROXYSHIFT_VM_KUBECONFIG"

// APIServer returns the path of the kubeconfig and the client
// configuration that reach the test API server from inside the VM. Outside
// the VM it skips like Require; inside, it fails the test when the
// package was not marked "apiserver" in hack/vm/packages.txt.
func APIServer(t testing.TB) (string, *rest.Config) {
	t.Helper()
	Require(t, "the test VM's API server")
	path := os.Getenv(KubeconfigEnvVar)
	if path == "" {
		t.Fatalf("%s is not set: mark the package \"apiserver\" in hack/vm/packages.txt", KubeconfigEnvVar)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		t.Fatal(err)
	}
	return path, cfg
}
