// Package report is the one writer of the agent's ProxyNode status. The
// agent's parts tell the Reporter what they know (the switch's phase and
// outcome, the last sync, the kernel facts); the Reporter turns that into
// status fields and conditions and patches the status subresource, only
// when something changed, and retries until the API server takes it. The
// API server being away never holds the agent up.
package report

import (
	"context"
	"encoding/json"
	jsonpatch "github.com/evanphx/json-patch/v5"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
)

// Client lists and watches ProxyNodes and patches their status: exactly
// the agent's RBAC (list, watch proxynodes; patch proxynodes/status).
type Client struct {
	rc *rest.RESTClient
}

// NewClient returns a Client for the API server cfg reaches.
func NewClient(cfg *rest.Config) (*Client, error) {
	scheme := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	metav1.AddToGroupVersion(scheme, v1alpha1.GroupVersion)
	c := rest.CopyConfig(cfg)
	c.GroupVersion = &v1alpha1.GroupVersion
	c.APIPath = "/apis"
	c.NegotiatedSerializer = serializer.NewCodecFactory(scheme).WithoutConversion()
	if c.UserAgent == "" {
		c.UserAgent = "proxyshift-agent"
	}
	rc, err := rest.RESTClientFor(c)
	if err != nil {
		return nil, err
	}
	return &Client{rc: rc}, nil
}

// PatchStatus merge-patches the status subresource from prev (what the
// API server is believed to hold; nil if nothing) to status. A field
// status no longer has is sent as null, so it is cleared: a plain merge
// patch of the new status would leave it as it was (the fields are
// omitempty). It returns the UID of the ProxyNode patched: a ProxyNode
// deleted and recreated under the same name does not hold prev.
func (c *Client) PatchStatus(ctx context.Context, name string, prev, status *v1alpha1.ProxyNodeStatus) (types.UID, error) {
	body, err := json.Marshal(map[string]any{"status": status})
	if err != nil {
		return "", err
	}
	if prev != nil {
		old, err := json.Marshal(map[string]any{"status": prev})
		if err != nil {
			return "", err
		}
		if body, err = jsonpatch.CreateMergePatch(old, body); err != nil {
			return "", err
		}
	}
	patched := &v1alpha1.ProxyNode{}
	if err := c.rc.Patch(types.MergePatchType).Resource("proxynodes").Name(name).SubResource("status").Body(body).Do(ctx).Into(patched); err != nil {
		return "", err
	}
	return patched.UID, nil
}

// ListWatch lists and watches the one ProxyNode named name, for an
// informer.
func (c *Client) ListWatch(name string) cache.ListerWatcher {
	sel := fields.OneTermEqualSelector("metadata.name", name).String()
	return &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = sel
			l := &v1alpha1.ProxyNodeList{}
			err := c.rc.Get().Resource("proxynodes").VersionedParams(&o, metav1.ParameterCodec).Do(ctx).Into(l)
			return l, err
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = sel
			o.Watch = true
			return c.rc.Get().Resource("proxynodes").VersionedParams(&o, metav1.ParameterCodec).Watch(ctx)
		},
	}
}

// condition finds a condition by type.
func condition(cs []metav1.Condition, typ string) *metav1.Condition {
	return meta.FindStatusCondition(cs, typ)
}
