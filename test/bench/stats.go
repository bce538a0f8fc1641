package bench

import (
	"math"
	"slices"
	"time"
)

// Percentile is the p-th percentile (0 < p <= 100) of ds by the nearest
// rank method, or 0 for none.
func Percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	rank := int(math.Ceil(p / 100 * float64(len(s))))
	return s[max(0, min(rank, len(s))-1)]
}
