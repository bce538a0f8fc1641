package dataplane

import (
	"context"
	"errors"

	corev1 "k8s.io/api/core/v1"

	"github.com/proxyshift/proxyshift/nodeagent/model"
)

// SumFamilies adds up what count says of each family, in order. It stops
// at the first error, or when ctx ends, returning what it added so far.
func SumFamilies[F any](ctx context.Context, families []F, count func(F) (Counts, error)) (Counts, error) {
	var total Counts
	for _, f := range families {
		if err := ctx.Err(); err != nil {
			return total, err
		}
		c, err := count(f)
		total = total.Plus(c)
		if err != nil {
			return total, err
		}
	}
	return total, nil
}

// SyncFamilies calls sync, in the order of families, for each family whose
// IP family (given by key) the model holds; families the model lacks are
// left as they are. It stops early when ctx ends, and returns every
// family's error joined, so one family failing does not keep the other
// from being synced. A request without a model is an error.
func SyncFamilies[F any](ctx context.Context, req SyncRequest, families []F, key func(F) corev1.IPFamily,
	sync func(F, map[model.ServicePortName]*model.ServicePort) error) error {
	if req.Model == nil {
		return errors.New("dataplane: sync without a model")
	}
	var errs []error
	for _, f := range families {
		ports, ok := req.Model.Ports[key(f)]
		if !ok {
			continue
		}
		if err := ctx.Err(); err != nil {
			errs = append(errs, err)
			break
		}
		if err := sync(f, ports); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
