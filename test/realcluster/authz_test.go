package realcluster

import (
	"strings"
	"testing"

	authenticationv1 "k8s.io/api/authentication/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
)

// checkNodeScopedWrites asks the API server, as the kubelet does for an
// agent pod's projected token, for a ServiceAccount token bound to the
// agent pod on the first node, and writes ProxyNode statuses with it
// (server-side dry runs, so admission decides and nothing is stored): its
// own node's status is allowed, another node's is refused by the
// admission policy with a message naming both, and its own ProxyNode's
// spec by RBAC.
func checkNodeScopedWrites(t *testing.T, c *Cluster) {
	ctx := t.Context()
	node, other := c.Nodes[0].Name, c.Nodes[1].Name
	pods, err := c.Kube.CoreV1().Pods("proxyshift-system").List(ctx, metav1.ListOptions{
		LabelSelector: "app.kubernetes.io/component=agent", FieldSelector: "spec.nodeName=" + node,
	})
	if err != nil || len(pods.Items) != 1 {
		t.Fatalf("the agent pod on %s: %v (%d pods)", node, err, len(pods.Items))
	}
	pod := pods.Items[0]
	tr, err := c.Kube.CoreV1().ServiceAccounts("proxyshift-system").CreateToken(ctx, pod.Spec.ServiceAccountName, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{
			ExpirationSeconds: ptr.To[int64](600),
			BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := rest.AnonymousClientConfig(c.Config)
	cfg.BearerToken = tr.Status.Token
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	res := v1alpha1.GroupVersion.WithResource("proxynodes")
	patch := []byte(`{"status":{"phase":"Failed"}}`)
	dry := metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}}
	if _, err := dyn.Resource(res).Patch(ctx, node, types.MergePatchType, patch, dry, "status"); err != nil {
		t.Errorf("the agent on %s writing its own ProxyNode's status: %v; want it allowed", node, err)
	}
	for _, w := range []struct {
		name, sub, want string
	}{
		{other, "status", "proxyshift-agent on node " + node + " may write only ProxyNode " + node + ", not ProxyNode " + other},
		// RBAC refuses it before the policy would: the agent's role has
		// no verb on the object itself.
		{node, "", `cannot patch resource "proxynodes"`},
	} {
		body := patch
		if w.sub == "" {
			body = []byte(`{"spec":{"desiredMode":"iptables"}}`)
		}
		var subs []string
		if w.sub != "" {
			subs = []string{w.sub}
		}
		_, err := dyn.Resource(res).Patch(ctx, w.name, types.MergePatchType, body, dry, subs...)
		if !apierrors.IsForbidden(err) && !apierrors.IsInvalid(err) || err == nil || !strings.Contains(err.Error(), w.want) {
			t.Errorf("the agent on %s writing ProxyNode %s %s: %v; want refused with %q", node, w.name, w.sub, err, w.want)
		} else {
			t.Logf("refused as it should be: %v", err)
		}
	}
}
