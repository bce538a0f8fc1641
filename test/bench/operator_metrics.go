package bench

import (
	"fmt"
	"io"
	"math"
	"sort"
	"time"

	dto "github.com/prometheus/client_model/go"
)

// Reconciles is one controller's reconcile figures from controller-runtime's
// metrics: controller_runtime_reconcile_total (by result) and the
// controller_runtime_reconcile_time_seconds histogram.
type Reconciles struct {
	// Total and Errors count reconciles (Errors: result "error").
	Total, Errors int
	// Buckets are the histogram's cumulative counts by upper bound
	// (seconds), ascending, +Inf last.
	Buckets []Bucket
	// Count and Sum are the histogram's.
	Count uint64
	Sum   float64
}

// Bucket is one cumulative histogram bucket.
type Bucket struct {
	UpperBound float64
	Count      uint64
}

// reconcileMetrics reads every controller's figures from a metrics page.
func reconcileMetrics(body io.Reader) (map[string]*Reconciles, error) {
	families, err := metricFamilies(body)
	if err != nil {
		return nil, err
	}
	out := map[string]*Reconciles{}
	get := func(m *dto.Metric) *Reconciles {
		name := label(m, "controller")
		if out[name] == nil {
			out[name] = &Reconciles{}
		}
		return out[name]
	}
	if f := families["controller_runtime_reconcile_total"]; f != nil {
		for _, m := range f.GetMetric() {
			r, n := get(m), int(m.GetCounter().GetValue())
			r.Total += n
			if label(m, "result") == "error" {
				r.Errors += n
			}
		}
	}
	if f := families["controller_runtime_reconcile_time_seconds"]; f != nil {
		if f.GetType() != dto.MetricType_HISTOGRAM {
			return nil, fmt.Errorf("controller_runtime_reconcile_time_seconds is a %s, not a histogram", f.GetType())
		}
		for _, m := range f.GetMetric() {
			r, h := get(m), m.GetHistogram()
			r.Count, r.Sum = h.GetSampleCount(), h.GetSampleSum()
			r.Buckets = r.Buckets[:0]
			for _, b := range h.GetBucket() {
				r.Buckets = append(r.Buckets, Bucket{UpperBound: b.GetUpperBound(), Count: b.GetCumulativeCount()})
			}
			sort.Slice(r.Buckets, func(i, j int) bool { return r.Buckets[i].UpperBound < r.Buckets[j].UpperBound })
			if n := len(r.Buckets); n == 0 || !math.IsInf(r.Buckets[n-1].UpperBound, 1) {
				r.Buckets = append(r.Buckets, Bucket{UpperBound: math.Inf(1), Count: r.Count})
			}
		}
	}
	return out, nil
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// Quantile estimates the q-th quantile (0 < q <= 1) the way Prometheus'
// histogram_quantile does: linearly within the bucket that holds it,
// from 0 for the first bucket; the largest finite bound when it falls in
// +Inf. 0 without observations.
func (r *Reconciles) Quantile(q float64) time.Duration {
	if r.Count == 0 {
		return 0
	}
	rank := q * float64(r.Count)
	lower, below := 0.0, uint64(0)
	for _, b := range r.Buckets {
		if float64(b.Count) >= rank {
			if math.IsInf(b.UpperBound, 1) {
				return seconds(lower)
			}
			in := float64(b.Count - below)
			return seconds(lower + (b.UpperBound-lower)*(rank-float64(below))/in)
		}
		lower, below = b.UpperBound, b.Count
	}
	return seconds(lower)
}

// MaxBound is the upper bound of the highest bucket holding an
// observation: the histogram says the slowest reconcile took at most
// that. beyond says it fell in +Inf: it took more than bound, the
// largest finite one.
func (r *Reconciles) MaxBound() (bound time.Duration, beyond bool) {
	below, lower := uint64(0), 0.0
	for _, b := range r.Buckets {
		if b.Count > below {
			if math.IsInf(b.UpperBound, 1) {
				return seconds(lower), true
			}
			bound = seconds(b.UpperBound)
		}
		below, lower = b.Count, b.UpperBound
	}
	return bound, false
}

// Mean is the mean reconcile time.
func (r *Reconciles) Mean() time.Duration {
	if r.Count == 0 {
		return 0
	}
	return seconds(r.Sum / float64(r.Count))
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
