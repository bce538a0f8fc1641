package realcluster

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/proxyshift/proxyshift/api/contract"
	"github.com/proxyshift/proxyshift/api/v1alpha1"
)

// ClusterCIDR is the pod network (kube-proxy's clusterCIDR in
// manifests/kube-proxy.yaml).
const ClusterCIDR = "198.18.64.0/18"

// NewProxyConfig is the ProxyConfig the migration tests and the demo
// apply: every node, one canary, then one node at a time, a node timeout
// of 3 minutes, rolling back on failure.
func NewProxyConfig(name string, mode v1alpha1.ProxyMode) *v1alpha1.ProxyConfig {
	pc := &v1alpha1.ProxyConfig{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1alpha1.ProxyConfigSpec{Rollout: v1alpha1.RolloutPolicy{
			MaxUnavailable: ptr.To(intstr.FromInt32(1)),
			Canary:         v1alpha1.CanaryPolicy{Nodes: ptr.To[int32](1)},
			NodeTimeout:    "3m",
			AutoRollback:   ptr.To(true),
		}},
	}
	SetMode(pc, mode)
	return pc
}

// SetMode sets the mode and what goes with it: the pod network for
// proxyshift's modes, nothing for kube-proxy (it has its own settings).
func SetMode(pc *v1alpha1.ProxyConfig, mode v1alpha1.ProxyMode) {
	pc.Spec.Mode = mode
	pc.Spec.ClusterCIDRs = nil
	if contract.ValidMode(mode) {
		pc.Spec.ClusterCIDRs = []v1alpha1.CIDR{ClusterCIDR}
	}
}

// ApplyMode creates the ProxyConfig name in mode (NewProxyConfig) or sets
// the mode of the existing one, returning the generation that carries it.
func ApplyMode(ctx context.Context, cl client.Client, name string, mode v1alpha1.ProxyMode) (int64, error) {
	for range 10 {
		pc := &v1alpha1.ProxyConfig{}
		err := cl.Get(ctx, client.ObjectKey{Name: name}, pc)
		if apierrors.IsNotFound(err) {
			pc = NewProxyConfig(name, mode)
			if err := cl.Create(ctx, pc); err != nil {
				return 0, err
			}
			return pc.Generation, nil
		}
		if err != nil {
			return 0, err
		}
		SetMode(pc, mode)
		if err := cl.Update(ctx, pc); apierrors.IsConflict(err) {
			continue
		} else if err != nil {
			return 0, err
		}
		return pc.Generation, nil
	}
	return 0, fmt.Errorf("ProxyConfig %s: updates kept conflicting", name)
}

// ApplyKubeProxyMode creates the ProxyConfig name (NewProxyConfig's
// rollout policy) or changes the existing one to move kube-proxy itself
// into mode, bridged by proxyshift (spec.kubeProxy), returning the
// generation that carries it.
func ApplyKubeProxyMode(ctx context.Context, cl client.Client, name string, mode v1alpha1.ProxyMode) (int64, error) {
	for range 10 {
		pc := &v1alpha1.ProxyConfig{}
		err := cl.Get(ctx, client.ObjectKey{Name: name}, pc)
		create := apierrors.IsNotFound(err)
		if create {
			pc = NewProxyConfig(name, v1alpha1.ModeKubeProxy)
		} else if err != nil {
			return 0, err
		}
		SetMode(pc, v1alpha1.ModeKubeProxy)
		pc.Spec.KubeProxy = &v1alpha1.KubeProxyModeChange{Mode: mode}
		if create {
			err = cl.Create(ctx, pc)
		} else {
			err = cl.Update(ctx, pc)
		}
		if apierrors.IsConflict(err) {
			continue
		} else if err != nil {
			return 0, err
		}
		return pc.Generation, nil
	}
	return 0, fmt.Errorf("ProxyConfig %s: updates kept conflicting", name)
}
