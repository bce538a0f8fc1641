package agent

import (
	"bytes"
	"fmt"
	"runtime"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apiruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/kubernetes/scheme"
)

// benchmarkInformerObjects measures what n Services and their
// EndpointSlices (10 endpoints each, as fullObjects makes them: with
// managedFields, pod targetRefs and the annotations the API server and
// kubectl add) hold in memory once decoded from protobuf, as the
// informers receive them, with or without the informers' transform. It
// reports the bytes kept per Service (with its slice) after a GC.
func benchmarkInformerObjects(b *testing.B, n int, trim bool) {
	codecs := serializer.NewCodecFactory(scheme.Scheme)
	info, _ := apiruntime.SerializerInfoForMediaType(codecs.SupportedMediaTypes(), "application/vnd.kubernetes.protobuf")
	enc := codecs.EncoderForVersion(info.Serializer, corev1.SchemeGroupVersion)
	encSlice := codecs.EncoderForVersion(info.Serializer, discoveryv1.SchemeGroupVersion)
	dec := codecs.UniversalDeserializer()
	var wire [][]byte
	for i := range n {
		svc, slice := fullObjects()
		svc.Name, slice.Name = fmt.Sprintf("svc-%05d", i), fmt.Sprintf("svc-%05d-abc", i)
		for len(slice.Endpoints) < 10 {
			slice.Endpoints = append(slice.Endpoints, slice.Endpoints[0])
		}
		sb, err := encode(enc, svc)
		if err != nil {
			b.Fatal(err)
		}
		eb, err := encode(encSlice, slice)
		if err != nil {
			b.Fatal(err)
		}
		wire = append(wire, sb, eb)
	}
	var kept float64
	b.ResetTimer()
	for range b.N {
		before := heapInUse()
		objs := make([]any, 0, len(wire))
		for _, w := range wire {
			o, _, err := dec.Decode(w, nil, nil)
			if err != nil {
				b.Fatal(err)
			}
			if trim {
				t, err := trimObject(o)
				if err != nil {
					b.Fatal(err)
				}
				o = t.(apiruntime.Object)
			}
			objs = append(objs, o)
		}
		kept = float64(heapInUse()-before) / float64(n)
		runtime.KeepAlive(objs)
	}
	b.ReportMetric(kept, "B/service")
}

func encode(enc apiruntime.Encoder, obj apiruntime.Object) ([]byte, error) {
	var buf bytes.Buffer
	err := enc.Encode(obj, &buf)
	return buf.Bytes(), err
}

// heapInUse is the bytes of live heap objects after a full GC.
func heapInUse() int64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

func BenchmarkInformerObjects10k(b *testing.B)        { benchmarkInformerObjects(b, 10000, false) }
func BenchmarkInformerObjectsTrimmed10k(b *testing.B) { benchmarkInformerObjects(b, 10000, true) }
