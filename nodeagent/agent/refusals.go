package agent

import (
	"context"
	"errors"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"

	"github.com/proxyshift/proxyshift/nodeagent/healthcheck"
	"github.com/proxyshift/proxyshift/nodeagent/model"
)

// ReasonExternalAddressRefused is the reason of the Warning Event an
// agent records on a Service whose external address it does not route.
const ReasonExternalAddressRefused = "ExternalAddressRefused"

// ReasonHealthCheckNotServed is the reason of the Warning Event an agent
// records on a Service whose health-check node port it cannot bind
// (kube-proxy's reason for the same).
const ReasonHealthCheckNotServed = "FailedToStartServiceHealthcheck"

// refusalReporter logs what the model skips, and records a Warning Event
// on each Service whose external address the model's claims refuse, or
// whose health-check node port cannot be bound, so that whoever owns the
// Service sees why its address or its health check does not answer.
type refusalReporter struct {
	services corelisters.ServiceLister
	recorder events.EventRecorder
	node     string
}

// newRefusalReporter records Events through client (events.k8s.io) until
// ctx ends, as proxyshift-agent on node.
func newRefusalReporter(ctx context.Context, client kubernetes.Interface, services corelisters.ServiceLister, node string) *refusalReporter {
	b := events.NewBroadcaster(&events.EventSinkImpl{Interface: client.EventsV1()})
	b.StartRecordingToSink(ctx.Done())
	context.AfterFunc(ctx, b.Shutdown)
	return &refusalReporter{services: services, recorder: b.NewRecorder(scheme.Scheme, "proxyshift.io/agent"), node: node}
}

// report takes one error of the model tracker.
func (r *refusalReporter) report(err error) {
	var refusal *model.Refusal
	if !errors.As(err, &refusal) {
		klog.ErrorS(err, "Skipped a malformed part of a Service or EndpointSlice; the rest is programmed")
		return
	}
	klog.InfoS("Refused an external address of a Service", "service", refusal.Service.String(), "field", refusal.Field,
		"address", refusal.Addr, "port", refusal.Port, "reason", refusal.Reason)
	svc, lerr := r.services.Services(refusal.Service.Namespace).Get(refusal.Service.Name)
	if lerr != nil {
		return // gone already
	}
	r.recorder.Eventf(svc, nil, corev1.EventTypeWarning, ReasonExternalAddressRefused, "Route", "node %s: %s", r.node, refusal.Error())
}

// healthCheckNotBound records that a Service's health-check node port
// could not be bound (healthcheck.Server.OnBindFailure).
func (r *refusalReporter) healthCheckNotBound(c healthcheck.Check, err error) {
	svc, lerr := r.services.Services(c.Service.Namespace).Get(c.Service.Name)
	if lerr != nil {
		return // gone already
	}
	r.recorder.Eventf(svc, nil, corev1.EventTypeWarning, ReasonHealthCheckNotServed, "Listen",
		"node %s: cannot serve the %s health check on port %d (retrying): %v", r.node, c.Family, c.Port, err)
}
