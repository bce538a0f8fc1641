package apiserver_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	proxyv1alpha1 "github.com/proxyshift/proxyshift/api/v1alpha1"
	"github.com/proxyshift/proxyshift/test/testenv"
)

const (
	installNS = "proxyshift-system"
	agentSA   = "proxyshift-agent"
	agentUser = "system:serviceaccount:" + installNS + ":" + agentSA
	// nodeNameExtra is the user extra the API server sets from a
	// pod-bound token: the node the pod runs on.
	nodeNameExtra = "authentication.kubernetes.io/node-name"
)

// TestAgentWritesOnlyItsOwnProxyNode installs config/default and checks
// the admission policy that ties an agent's writes to its node: with a
// token bound to a pod on node-1, the API server lets the agent patch
// ProxyNode node-1's status and refuses node-2's, saying why; a token of
// the same ServiceAccount that is bound to no pod (no node claim) may
// write nothing. The tokens are real TokenRequest tokens, checked by the
// API server's own authenticator; an impersonated identity with the node
// extra shows the same rule from the other node's side.
func TestAgentWritesOnlyItsOwnProxyNode(t *testing.T) {
	env := testenv.Start(t)
	ctx := context.Background()
	if out, err := env.Kubectl(t, "apply", "-k", "config/default"); err != nil {
		t.Fatalf("install: %v\n%s", err, out)
	}
	kube := kubernetes.NewForConfigOrDie(env.Config)

	for _, n := range []string{"node-1", "node-2"} {
		if _, err := kube.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := env.Client.Create(ctx, &proxyv1alpha1.ProxyNode{ObjectMeta: metav1.ObjectMeta{Name: n}}); err != nil {
			t.Fatal(err)
		}
	}
	// The agent's pod on node-1, as the DaemonSet would place it (no
	// kubelet runs it: the API server needs the object to bind a token).
	pod, err := kube.CoreV1().Pods(installNS).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "proxyshift-agent-node-1"},
		Spec: corev1.PodSpec{
			ServiceAccountName: agentSA,
			NodeName:           "node-1",
			Containers:         []corev1.Container{{Name: "agent", Image: "proxyshift-agent"}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	token := func(bound *authenticationv1.BoundObjectReference) string {
		tr, err := kube.CoreV1().ServiceAccounts(installNS).CreateToken(ctx, agentSA, &authenticationv1.TokenRequest{
			Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To(int64(3600)), BoundObjectRef: bound},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return tr.Status.Token
	}
	withToken := func(tok string) *rest.Config {
		return &rest.Config{Host: env.Config.Host, TLSClientConfig: rest.TLSClientConfig{CAData: env.Config.CAData}, BearerToken: tok}
	}
	boundCfg := withToken(token(&authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID}))
	unboundCfg := withToken(token(nil))
	impersonated := rest.CopyConfig(env.Config)
	impersonated.Impersonate = rest.ImpersonationConfig{
		UserName: agentUser,
		Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:" + installNS, "system:authenticated"},
		Extra:    map[string][]string{nodeNameExtra: {"node-2"}},
	}

	// The API server reports who a token is: the bound one carries the
	// node claim the policy reads.
	review, err := kubernetes.NewForConfigOrDie(boundCfg).AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if u := review.Status.UserInfo; u.Username != agentUser || fmt.Sprint(u.Extra[nodeNameExtra]) != "[node-1]" {
		t.Fatalf("pod-bound token authenticates as %q with extra %v; want %s with %s [node-1]", u.Username, u.Extra, agentUser, nodeNameExtra)
	}

	patchStatus := func(cfg *rest.Config, node string) error {
		c, err := client.New(cfg, client.Options{Scheme: env.Scheme})
		if err != nil {
			t.Fatal(err)
		}
		pn := &proxyv1alpha1.ProxyNode{ObjectMeta: metav1.ObjectMeta{Name: node}}
		body := fmt.Sprintf(`{"status":{"phase":"Active","activeMode":"nftables","observedConfig":{"name":"forged-%d","generation":1}}}`, time.Now().UnixNano())
		return c.Status().Patch(ctx, pn, client.RawPatch(types.MergePatchType, []byte(body)))
	}
	// Policies and RBAC reach the API server's caches a moment after they
	// are written: poll until the answer is the settled one.
	expect := func(t *testing.T, what string, cfg *rest.Config, node string, allowed bool, message ...string) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			err := patchStatus(cfg, node)
			ok := allowed && err == nil
			if !allowed && err != nil {
				ok = true
				for _, m := range message {
					ok = ok && strings.Contains(err.Error(), m)
				}
			}
			if ok {
				t.Logf("%s: %v", what, err)
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: patch ProxyNode %s status: %v; want allowed=%v with %q", what, node, err, allowed, message)
			}
			time.Sleep(250 * time.Millisecond)
		}
	}

	t.Run("own node allowed", func(t *testing.T) {
		expect(t, "token bound to a pod on node-1, ProxyNode node-1", boundCfg, "node-1", true)
	})
	t.Run("other node denied", func(t *testing.T) {
		expect(t, "token bound to a pod on node-1, ProxyNode node-2", boundCfg, "node-2", false,
			"proxyshift-agent-own-proxynode", "proxyshift-agent on node node-1 may write only ProxyNode node-1, not ProxyNode node-2")
	})
	t.Run("unbound token denied", func(t *testing.T) {
		for _, node := range []string{"node-1", "node-2"} {
			expect(t, "token bound to no pod, ProxyNode "+node, unboundCfg, node, false,
				"proxyshift-agent-own-proxynode", "this request's credentials name no node")
		}
	})
	t.Run("impersonated node-2", func(t *testing.T) {
		expect(t, "identity with node-2's claim, ProxyNode node-2", impersonated, "node-2", true)
		expect(t, "identity with node-2's claim, ProxyNode node-1", impersonated, "node-1", false,
			"proxyshift-agent on node node-2 may write only ProxyNode node-2, not ProxyNode node-1")
	})
	t.Run("spec never", func(t *testing.T) {
		c, err := client.New(boundCfg, client.Options{Scheme: env.Scheme})
		if err != nil {
			t.Fatal(err)
		}
		pn := &proxyv1alpha1.ProxyNode{ObjectMeta: metav1.ObjectMeta{Name: "node-1"}}
		err = c.Patch(ctx, pn, client.RawPatch(types.MergePatchType, []byte(`{"spec":{"desiredMode":"ipvs"}}`)))
		if err == nil || !strings.Contains(err.Error(), "forbidden") {
			t.Errorf("agent patched its ProxyNode's spec: %v", err)
		}
	})
}
