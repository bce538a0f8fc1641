package controllers

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
)

func TestRelevantChange(t *testing.T) {
	for name, tc := range map[string]struct {
		mut  func(*v1alpha1.ProxyNode)
		want bool
	}{
		"nothing":           {func(*v1alpha1.ProxyNode) {}, false},
		"sync time":         {func(p *v1alpha1.ProxyNode) { p.Status.LastSyncTime = &metav1.Time{Time: time.Now()} }, false},
		"counts":            {func(p *v1alpha1.ProxyNode) { p.Status.Counts = &v1alpha1.RuleCounts{Rules: 5} }, false},
		"reported time":     {func(p *v1alpha1.ProxyNode) { p.Status.Kernel.ReportedTime = &metav1.Time{Time: time.Now()} }, false},
		"condition message": {func(p *v1alpha1.ProxyNode) { p.Status.Conditions[0].Message = "still ok" }, false},
		"spec":              {func(p *v1alpha1.ProxyNode) { p.Spec.DesiredMode = v1alpha1.ModeNFTables }, true},
		"annotation":        {func(p *v1alpha1.ProxyNode) { p.Annotations["a"] = "c" }, true},
		"active mode":       {func(p *v1alpha1.ProxyNode) { p.Status.ActiveMode = v1alpha1.ModeIPVS }, true},
		"phase":             {func(p *v1alpha1.ProxyNode) { p.Status.Phase = v1alpha1.NodeProgramming }, true},
		"kube-proxy mode":   {func(p *v1alpha1.ProxyNode) { p.Status.KubeProxyMode = v1alpha1.ModeIPTables }, true},
		"observed config": {func(p *v1alpha1.ProxyNode) {
			p.Status.ObservedConfig = &v1alpha1.ConfigReference{Name: "pc", Generation: 1}
		}, true},
		"kernel facts":      {func(p *v1alpha1.ProxyNode) { p.Status.Kernel.NFTables = v1alpha1.CapabilityNo }, true},
		"kernel facts gone": {func(p *v1alpha1.ProxyNode) { p.Status.Kernel = nil }, true},
		"condition status":  {func(p *v1alpha1.ProxyNode) { p.Status.Conditions[0].Status = metav1.ConditionFalse }, true},
		"condition added": {func(p *v1alpha1.ProxyNode) {
			p.Status.Conditions = append(p.Status.Conditions, metav1.Condition{Type: "Degraded"})
		}, true},
		"deletion requested": {func(p *v1alpha1.ProxyNode) { p.DeletionTimestamp = &metav1.Time{Time: time.Now()} }, true},
	} {
		o, n := pn(), pn()
		tc.mut(n)
		if got := relevantChange(o, n); got != tc.want {
			t.Errorf("%s: relevantChange = %v, want %v", name, got, tc.want)
		}
	}
}

func TestCacheTransform(t *testing.T) {
	tr := CacheOptions(Options{}).DefaultTransform
	p := pn()
	p.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "x"}}
	p.Status.LastSyncTime = &metav1.Time{Time: time.Now()}
	p.Status.Counts = &v1alpha1.RuleCounts{Rules: 3}
	out, err := tr(p)
	if err != nil {
		t.Fatal(err)
	}
	got := out.(*v1alpha1.ProxyNode)
	if got.ManagedFields != nil || got.Status.LastSyncTime != nil || got.Status.Counts != nil || got.Status.Kernel.Version != "" {
		t.Errorf("not stripped: %+v", got)
	}
	if got.Annotations["a"] != "b" || got.Spec.DesiredMode != v1alpha1.ModeIPVS || got.Status.Kernel.NFTables != v1alpha1.CapabilityYes {
		t.Errorf("stripped too much: %+v", got)
	}
	node := &metav1.PartialObjectMetadata{TypeMeta: metav1.TypeMeta{Kind: "Node", APIVersion: "v1"},
		ObjectMeta: metav1.ObjectMeta{Name: "n", Labels: map[string]string{"l": "v"}, Annotations: map[string]string{"big": "x"}}}
	out, _ = tr(node)
	if m := out.(*metav1.PartialObjectMetadata); m.Annotations != nil || m.Labels["l"] != "v" {
		t.Errorf("node metadata %+v", m)
	}
	now := metav1.Now()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "kube-proxy-x", Labels: map[string]string{"k8s-app": "kube-proxy"},
			Annotations: map[string]string{"big": "x"}, DeletionTimestamp: &now},
		Spec:   corev1.PodSpec{NodeName: "n", Containers: []corev1.Container{{Name: "kube-proxy"}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning},
	}
	out, _ = tr(pod)
	want := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "kube-proxy-x", Labels: pod.Labels, DeletionTimestamp: &now},
		Spec: corev1.PodSpec{NodeName: "n"}}
	if got := out.(*corev1.Pod); !apiequality.Semantic.DeepEqual(got, want) {
		t.Errorf("pod %+v, want %+v", got, want)
	}
}

// TestCacheTransformServices: the cache keeps of a Service what the
// findings read (findings.Trim), not the rest.
func TestCacheTransformServices(t *testing.T) {
	tr := CacheOptions(Options{}).DefaultTransform
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "front", Annotations: map[string]string{"big": "x"},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "x"}}},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, Selector: map[string]string{"app": "front"}, HealthCheckNodePort: 32000,
			ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyLocal},
	}
	out, err := tr(svc)
	if err != nil {
		t.Fatal(err)
	}
	got := out.(*corev1.Service)
	if got.Name != "front" || got.Spec.ExternalTrafficPolicy != corev1.ServiceExternalTrafficPolicyLocal || got.Spec.Type != corev1.ServiceTypeLoadBalancer {
		t.Errorf("stripped too much: %+v", got)
	}
	if got.Annotations != nil || got.ManagedFields != nil || got.Spec.Selector != nil || got.Spec.HealthCheckNodePort != 0 {
		t.Errorf("not stripped: %+v", got)
	}
}

func TestParseNamespacedName(t *testing.T) {
	for in, want := range map[string]string{"": "", "kube-system/kube-proxy": "kube-system/kube-proxy", "kube-proxy": "error",
		"/kube-proxy": "error", "kube-system/": "error", "a/b/c": "error"} {
		got, err := ParseNamespacedName(in)
		switch {
		case err != nil && want != "error", err == nil && want == "error":
			t.Errorf("%q: error %v", in, err)
		case err == nil && in != "" && got.String() != want, in == "" && got.Name != "":
			t.Errorf("%q: %v", in, got)
		}
	}
}
