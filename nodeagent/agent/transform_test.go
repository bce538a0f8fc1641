package agent

import (
	"reflect"
	"strings"
	"testing"
	"time"
	"unsafe"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/proxyshift/proxyshift/nodeagent/model"
)

// fullObjects returns a Service and its EndpointSlice with every field
// the API server fills or a user may set, among them all the ones the
// model reads (topology hints, a local endpoint, load-balancer ingress,
// affinity, traffic policies) and the trigger-time annotation.
func fullObjects() (*corev1.Service, *discoveryv1.EndpointSlice) {
	managed := []metav1.ManagedFieldsEntry{{Manager: "kubectl", Operation: metav1.ManagedFieldsOperationApply, FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:spec":{}}`)}}}
	local := corev1.ServiceInternalTrafficPolicyLocal
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{
			Name: "web", Namespace: "shop", UID: "u1", ResourceVersion: "7", Generation: 2,
			CreationTimestamp: metav1.NewTime(time.Date(2026, 12, 1, 20, 0, 0, 0, time.UTC)),
			Labels:            map[string]string{"app": "web"},
			Annotations:       map[string]string{"kubectl.kubernetes.io/last-applied-configuration": "{...}"},
			ManagedFields:     managed,
			OwnerReferences:   []metav1.OwnerReference{{Name: "x"}},
		},
		Spec: corev1.ServiceSpec{
			Type:                  corev1.ServiceTypeLoadBalancer,
			Selector:              map[string]string{"app": "web"},
			ClusterIP:             "198.18.0.10",
			ClusterIPs:            []string{"198.18.0.10"},
			IPFamilies:            []corev1.IPFamily{corev1.IPv4Protocol},
			Ports:                 []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080), NodePort: 30080}},
			ExternalIPs:           []string{"198.18.5.5"},
			SessionAffinity:       corev1.ServiceAffinityClientIP,
			SessionAffinityConfig: &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptr.To[int32](60)}},
			ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyLocal,
			InternalTrafficPolicy: &local,
			HealthCheckNodePort:   31000,
		},
		Status: corev1.ServiceStatus{LoadBalancer: corev1.LoadBalancerStatus{Ingress: []corev1.LoadBalancerIngress{{IP: "198.18.6.6"}}}},
	}
	ep := func(ip, node, zone string, ready bool) discoveryv1.Endpoint {
		return discoveryv1.Endpoint{
			Addresses:  []string{ip},
			Conditions: discoveryv1.EndpointConditions{Ready: &ready, Serving: &ready, Terminating: ptr.To(!ready)},
			NodeName:   &node, Zone: &zone, Hostname: ptr.To("pod"),
			TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: "shop", Name: "web-" + ip, UID: "p"},
			Hints:     &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: zone}}},
		}
	}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Name: "web-abc", Namespace: "shop", UID: "u2", ResourceVersion: "9",
			Labels: map[string]string{discoveryv1.LabelServiceName: "web", discoveryv1.LabelManagedBy: "endpointslice-controller.k8s.io"},
			Annotations: map[string]string{
				corev1.EndpointsLastChangeTriggerTime: time.Now().Add(time.Hour).UTC().Format(time.RFC3339), // after the tracker starts
				"other":                               "x",
			},
			ManagedFields:   managed,
			OwnerReferences: []metav1.OwnerReference{{Name: "web"}},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{ep("198.18.1.1", "node-a", "z1", true), ep("198.18.1.2", "node-b", "z2", false)},
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To[int32](8080)}},
	}
	return svc, slice
}

// TestTrimKeepsTheModel builds the model of one node from a Service and
// its EndpointSlice as the API server sends them and from the same
// objects after the informers' transform, and checks that the two models
// are the same while the transform dropped what the agent never reads.
func TestTrimKeepsTheModel(t *testing.T) {
	build := func(trim bool) *model.Snapshot {
		svc, slice := fullObjects()
		kept := model.SliceOf(slice)
		if trim {
			if _, err := trimObject(svc); err != nil {
				t.Fatal(err)
			}
			kept = trimmedSlice(t, slice)
		}
		// An older Service claims the same external IP, and arrives
		// second: the older one wins it, which the model knows by the
		// creation times.
		older := svc.DeepCopy()
		older.Name, older.UID = "zz-older", "u0" // after "web" by name
		older.Spec.ClusterIP, older.Spec.ClusterIPs = "198.18.0.11", []string{"198.18.0.11"}
		older.CreationTimestamp = metav1.NewTime(svc.CreationTimestamp.Add(-time.Hour))
		if trim {
			_, _ = trimObject(older)
		}
		tr := model.NewTracker("node-a", nil)
		tr.SetNodeZone("z1")
		tr.OnServiceAdd(svc)
		tr.OnEndpointSliceAdd(kept)
		tr.OnServiceAdd(older)
		snap, _ := tr.Snapshot()
		return snap
	}
	full, trimmed := build(false), build(true)
	if len(full.Ports[corev1.IPv4Protocol]) == 0 {
		t.Fatal("the untrimmed objects built no service port")
	}
	if !reflect.DeepEqual(full.Ports, trimmed.Ports) {
		t.Errorf("the model differs after trimming:\nfull:    %+v\ntrimmed: %+v", full.Ports, trimmed.Ports)
	}
	if len(full.Triggers) != 1 || !reflect.DeepEqual(full.Triggers, trimmed.Triggers) {
		t.Errorf("trigger times: full %v, trimmed %v", full.Triggers, trimmed.Triggers)
	}

	svc, slice := fullObjects()
	_, _ = trimObject(svc)
	kept := trimmedSlice(t, slice)
	if svc.ManagedFields != nil || svc.Annotations != nil || svc.Labels != nil || svc.Spec.Selector != nil || svc.OwnerReferences != nil {
		t.Errorf("the Service kept what the agent never reads: %+v", svc.ObjectMeta)
	}
	if svc.Name != "web" || svc.Namespace != "shop" || svc.UID != "u1" || svc.ResourceVersion != "7" || svc.CreationTimestamp.IsZero() {
		t.Errorf("the Service lost its identity (events name it) or its creation time (the oldest wins a contested address): %+v", svc.ObjectMeta)
	}
	if kept.ManagedFields != nil || len(kept.Labels) != 1 || len(kept.Annotations) != 1 || kept.OwnerReferences != nil {
		t.Errorf("the EndpointSlice kept what the agent never reads: %+v", kept.ObjectMeta)
	}
	if kept.Name != "web-abc" || kept.Namespace != "shop" || kept.ResourceVersion != "9" {
		t.Errorf("the EndpointSlice lost its identity: %+v", kept.ObjectMeta)
	}
	proxied := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{model.LabelServiceProxyName: "other", "app": "x"}}}
	_, _ = trimObject(proxied)
	if proxied.Labels[model.LabelServiceProxyName] != "other" || len(proxied.Labels) != 1 {
		t.Errorf("the service-proxy-name label, which the model reads, is not kept alone: %v", proxied.Labels)
	}
	tomb := "a tombstone"
	if got, _ := trimObject(tomb); got != tomb {
		t.Errorf("other objects are not passed through: %v", got)
	}
}

// trimmedSlice is the informers' transform of slice: a *model.Slice.
func trimmedSlice(t *testing.T, slice *discoveryv1.EndpointSlice) *model.Slice {
	t.Helper()
	o, err := trimObject(slice)
	if err != nil {
		t.Fatal(err)
	}
	kept, ok := o.(*model.Slice)
	if !ok {
		t.Fatalf("the transform of an EndpointSlice is a %T; want a *model.Slice", o)
	}
	return kept
}

// Two objects decoded apart share, once trimmed, the strings and the
// pointers to the API's values that they both hold: one copy in memory.
func TestTrimSharesWhatObjectsHoldAlike(t *testing.T) {
	svc1, slice1 := fullObjects()
	svc2, slice2 := fullObjects()
	// As decoded: every string its own copy.
	slice2.Endpoints[0].NodeName = ptr.To(strings.Clone(*slice1.Endpoints[0].NodeName))
	svc2.Spec.Ports[0].Name = strings.Clone(svc1.Spec.Ports[0].Name)
	for _, o := range []any{svc1, svc2} {
		_, _ = trimObject(o)
	}
	kept1, kept2 := trimmedSlice(t, slice1), trimmedSlice(t, slice2)
	same := func(what string, a, b string) {
		if unsafe.StringData(a) != unsafe.StringData(b) {
			t.Errorf("%s: two copies of %q", what, a)
		}
	}
	e1, e2 := kept1.Endpoints[0], kept2.Endpoints[0]
	same("node name", *e1.NodeName, *e2.NodeName)
	same("port name", svc1.Spec.Ports[0].Name, svc2.Spec.Ports[0].Name)
	same("service type", string(svc1.Spec.Type), string(svc2.Spec.Type))
	// Within a slice: endpoints on one node, one pointer to its name; the
	// addresses in one string.
	_, slice3 := fullObjects()
	slice3.Endpoints[1].NodeName = ptr.To(strings.Clone(*slice3.Endpoints[0].NodeName))
	kept3 := trimmedSlice(t, slice3)
	a, b := kept3.Endpoints[0], kept3.Endpoints[1]
	if a.NodeName != b.NodeName {
		t.Error("two endpoints on one node point to two copies of its name")
	}
	if unsafe.Pointer(unsafe.StringData(b.Address)) != unsafe.Add(unsafe.Pointer(unsafe.StringData(a.Address)), len(a.Address)) {
		t.Errorf("the endpoints' addresses are not packed in one string: %q, %q", a.Address, b.Address)
	}
	if kept1.Ports[0].Protocol != kept2.Ports[0].Protocol || svc1.Spec.InternalTrafficPolicy != svc2.Spec.InternalTrafficPolicy {
		t.Error("pointers to the API's values are not shared")
	}
	if !e1.Ready || kept1.Endpoints[1].Ready || *kept1.Ports[0].Protocol != corev1.ProtocolTCP {
		t.Error("sharing changed a value")
	}
}

// TestTrimFitsTheEndpoints: the decoder leaves room for more endpoints
// than a slice has; the cache keeps them in an array of their number,
// each as it was.
func TestTrimFitsTheEndpoints(t *testing.T) {
	_, slice := fullObjects()
	grown := make([]discoveryv1.Endpoint, len(slice.Endpoints), 4*len(slice.Endpoints))
	copy(grown, slice.Endpoints)
	slice.Endpoints = grown
	kept := trimmedSlice(t, slice)
	if cap(kept.Endpoints) != len(grown) || len(kept.Endpoints) != len(grown) {
		t.Errorf("the trimmed slice keeps room for %d endpoints, holding %d; want %d", cap(kept.Endpoints), len(kept.Endpoints), len(grown))
	}
	for i, e := range kept.Endpoints {
		if e.Address != grown[i].Addresses[0] || e.Ready != *grown[i].Conditions.Ready {
			t.Errorf("endpoint %d: %+v, was %+v", i, e, grown[i])
		}
	}
}

// TestKeepKeyTrimsSmallMapsInPlace: the labels of a decoded object keep
// the one entry the agent reads; a map of up to 8 entries is the same
// map afterwards (no allocation), a larger one a new map of one entry;
// without the key, or with no key asked for, nothing is kept.
func TestKeepKeyTrimsSmallMapsInPlace(t *testing.T) {
	small := map[string]string{
		discoveryv1.LabelServiceName: "web",
		discoveryv1.LabelManagedBy:   "endpointslice-controller.k8s.io",
		"app":                        "web",
	}
	got := keepKey(small, discoveryv1.LabelServiceName)
	if len(got) != 1 || got[discoveryv1.LabelServiceName] != "web" || reflect.ValueOf(got).UnsafePointer() != reflect.ValueOf(small).UnsafePointer() {
		t.Errorf("small map: got %v, want the same map holding only the service name", got)
	}
	decodedKey := strings.Clone(discoveryv1.LabelServiceName)
	for k := range keepKey(map[string]string{decodedKey: "web", "app": "web"}, discoveryv1.LabelServiceName) {
		if unsafe.StringData(k) == unsafe.StringData(decodedKey) {
			t.Error("the kept entry's key is the decoded copy, not the caller's string")
		}
	}
	large := map[string]string{discoveryv1.LabelServiceName: "web"}
	for i := range 12 {
		large["label-"+strings.Repeat("x", i)] = "v"
	}
	got = keepKey(large, discoveryv1.LabelServiceName)
	if len(got) != 1 || got[discoveryv1.LabelServiceName] != "web" || reflect.ValueOf(got).UnsafePointer() == reflect.ValueOf(large).UnsafePointer() {
		t.Errorf("large map: got %v, want a new map holding only the service name", got)
	}
	if got := keepKey(map[string]string{"app": "web"}, discoveryv1.LabelServiceName); got != nil {
		t.Errorf("without the key: got %v, want nil", got)
	}
	if got := keepKey(map[string]string{"": "x"}, ""); got != nil {
		t.Errorf("no key asked for: got %v, want nil", got)
	}
}
