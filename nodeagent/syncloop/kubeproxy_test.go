package syncloop

import (
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/proxyshift/proxyshift/nodeagent/dataplane"
	"github.com/proxyshift/proxyshift/nodeagent/model"
)

// histogram reads the sample count and sum of one series of h.
func histogram(t *testing.T, h *prometheus.HistogramVec, family string) (uint64, float64) {
	t.Helper()
	return observed(t, h.WithLabelValues(family))
}

// observed reads the sample count and sum of histogram o.
func observed(t *testing.T, o prometheus.Observer) (uint64, float64) {
	t.Helper()
	var m dto.Metric
	if err := o.(prometheus.Metric).Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum()
}

func TestKubeProxySyncMetrics(t *testing.T) {
	m := NewMetrics(prometheus.NewRegistry())
	before := float64(time.Now().Unix())
	m.RecordSync(true, 2*time.Second, dataplane.Counts{Services: 3}, nil)
	m.RecordSync(false, time.Second, dataplane.Counts{}, errors.New("kernel said no"))
	for _, fam := range []string{"IPv4", "IPv6"} {
		// Like kube-proxy's, the duration counts failed syncs too.
		if n, sum := histogram(t, m.KubeProxy.SyncDuration, fam); n != 2 || sum != 3 {
			t.Errorf("%s: %d syncs taking %vs, want 2 taking 3s", fam, n, sum)
		}
		if got := testutil.ToFloat64(m.KubeProxy.LastSyncTimestamp.WithLabelValues(fam)); got < before {
			t.Errorf("%s: last sync at %v, want the successful sync's time (>= %v)", fam, got, before)
		}
	}
}

func testService() *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web"},
		Spec: corev1.ServiceSpec{
			Type:       corev1.ServiceTypeClusterIP,
			ClusterIP:  "198.18.0.10",
			ClusterIPs: []string{"198.18.0.10"},
			IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol},
			Ports:      []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}},
		},
	}
}

// testSlice is an EndpointSlice of testService with one endpoint at addr,
// triggered at trigger unless that is zero.
func testSlice(name, addr string, trigger time.Time) *discoveryv1.EndpointSlice {
	port, tcp, http := int32(8080), corev1.ProtocolTCP, "http"
	s := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: "ns", Name: name,
			Labels: map[string]string{discoveryv1.LabelServiceName: "web"},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{addr}}},
		Ports:       []discoveryv1.EndpointPort{{Name: &http, Port: &port, Protocol: &tcp}},
	}
	if !trigger.IsZero() {
		s.Annotations = map[string]string{corev1.EndpointsLastChangeTriggerTime: trigger.Format(time.RFC3339Nano)}
	}
	return s
}

func TestKubeProxyChangeMetrics(t *testing.T) {
	m := NewMetrics(prometheus.NewRegistry())
	tr := model.NewTracker("node-a", nil)
	tr.Observe(m)
	tr.OnServiceAdd(testService())
	tr.OnServiceUpdate(testService())
	tr.OnEndpointSliceAdd(model.SliceOf(testSlice("web-1", "198.18.1.1", time.Time{})))
	if got := testutil.ToFloat64(m.KubeProxy.ServiceChanges); got != 2 {
		t.Errorf("service changes = %v, want 2", got)
	}
	if got := testutil.ToFloat64(m.KubeProxy.EndpointChanges); got != 1 {
		t.Errorf("endpoint changes = %v, want 1", got)
	}
	for _, fam := range []string{"IPv4", "IPv6"} {
		if got := testutil.ToFloat64(m.KubeProxy.LastQueued.WithLabelValues(fam)); got == 0 {
			t.Errorf("%s: no last queued time after changes", fam)
		}
	}
}

// TestNetworkProgrammingFromTriggerTime: kubeproxy_network_programming_
// duration_seconds runs from the slice's last-change-trigger-time to the
// end of the sync that programmed the change, however late the agent heard
// of it; a slice without the annotation is not measured.
func TestNetworkProgrammingFromTriggerTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := NewMetrics(prometheus.NewRegistry())
		tr := model.NewTracker("node-a", nil)
		tr.Observe(m)
		time.Sleep(time.Minute) // the changes below happen after the agent started
		tr.OnServiceAdd(testService())
		be := &recordingBackend{}
		run(t, Config{SyncPeriod: time.Hour}, tr, be, m)
		synctest.Wait()

		tr.OnEndpointSliceAdd(model.SliceOf(testSlice("web-1", "198.18.1.1", time.Now().Add(-5*time.Second))))
		synctest.Wait()
		n, sum := histogram(t, m.KubeProxy.NetworkProgramming, "IPv4")
		if n != 1 || sum < 5 {
			t.Fatalf("%d observations summing to %vs; want 1 of at least 5s", n, sum)
		}
		if _, sum := observed(t, m.NetworkProgramming); sum >= 5 {
			t.Error("proxyshift_network_programming_duration_seconds must run from when the agent heard of the change")
		}

		tr.OnEndpointSliceAdd(model.SliceOf(testSlice("web-2", "198.18.1.2", time.Time{})))
		synctest.Wait()
		if s, _ := be.snapshot(); len(s) != 3 {
			t.Fatalf("%d syncs, want 3 (first, and one per slice)", len(s))
		}
		if n, _ := histogram(t, m.KubeProxy.NetworkProgramming, "IPv4"); n != 1 {
			t.Errorf("%d observations after a slice without the annotation; want still 1", n)
		}
	})
}
