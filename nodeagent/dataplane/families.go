package dataplane

import (
	"context"
	"errors"

	corev1 "k8s.io/api/core/v1"

	"github.com/proxyshift/proxyshift/nodeagent/model"
)

// SyncFamilies calls sync, in the order of families, for each family whose
// IP family (given by key) the model holds; families the model lacks are
// left as they are. It stops early when ctx ends, and returns every
// family's error joined, so one family failing does not keep the other
// from being synced.
func SyncFamilies[F any](ctx context.Context, req SyncRequest, families []F, key func(F) corev1.IPFamily,
	sync func(F, map[model.ServicePortName]*model.ServicePort) error) error {
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
