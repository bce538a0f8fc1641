package switcher

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
	"github.com/proxyshift/proxyshift/nodeagent/dataplane"
	"github.com/proxyshift/proxyshift/nodeagent/model"
	"github.com/proxyshift/proxyshift/nodeagent/probe"
	"github.com/proxyshift/proxyshift/nodeagent/report"
	"github.com/proxyshift/proxyshift/test/netlab"
)

type recordingReporter struct{ got []report.Switch }

func (r *recordingReporter) SetSwitch(s report.Switch)   { r.got = append(r.got, s) }
func (r *recordingReporter) Flush(context.Context) error { return nil }

type failingPreparer struct{}

func (failingPreparer) Prepare(context.Context, v1alpha1.ProxyMode, v1alpha1.IPVSScheduler) error {
	return errors.New("module ip_vs is missing")
}

// TestSpecArrivingMidSwitchIsNotAnsweredByIt is the operator/agent
// start-up race: the agent is in its own start-up switch (decided from a
// desire without any config) when the operator writes a spec with a
// config reference. Neither the switch's end nor its failure may be
// reported under the new config and generation: the operator would read
// the older switch's outcome as the answer to its spec (a mode other
// than the one it asked for, or a failure) and roll the node back, and a
// failure would hold the new spec as already failed.
func TestSpecArrivingMidSwitchIsNotAnsweredByIt(t *testing.T) {
	rec := &recordingReporter{}
	startup := Desire{Mode: v1alpha1.ModeIPTables}
	s := New(Config{Prepare: failingPreparer{}, Report: rec}, startup)
	s.decidedBy = startup // as Init records the desire its first decision came from
	spec := Desire{Mode: v1alpha1.ModeNFTables, Config: &v1alpha1.ConfigReference{Name: "cluster", Generation: 3}, Generation: 7}
	s.SetDesire(spec)

	ctx := context.Background()
	s.report(ctx, State{Phase: v1alpha1.NodeActive, Target: v1alpha1.ModeIPTables}, Step{Action: Serve, Mode: v1alpha1.ModeIPTables})
	if got := rec.got[len(rec.got)-1]; got.Config != nil || got.Generation != 0 {
		t.Errorf("the start-up switch's end was reported under the new spec: config %+v, generation %d", got.Config, got.Generation)
	}

	st := State{Phase: v1alpha1.NodePreparing, Target: v1alpha1.ModeIPTables}
	if res := s.execute(ctx, st, Step{Action: Prepare, Mode: v1alpha1.ModeIPTables}); res != Failed {
		t.Fatalf("prepare with a missing module: %v, want Failed", res)
	}
	s.report(ctx, State{Phase: v1alpha1.NodeFailed, Target: v1alpha1.ModeIPTables}, Step{Action: Wait})
	if got := rec.got[len(rec.got)-1]; got.Generation == spec.Generation || got.Config != nil {
		t.Errorf("the start-up switch's failure was reported under the new spec: %+v", got)
	}
	in, _, err := s.input(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	if in.Held {
		t.Error("the new spec is held as failed although its switch never ran")
	}
}

// probeWaitingBackend is a countingBackend whose Programmed waits until
// a probe has reached the node's listener (probed is closed), or gives up
// after 10 s: a read back that can end only while the probes run.
type probeWaitingBackend struct {
	countingBackend
	probed <-chan struct{}
}

func (b *probeWaitingBackend) Programmed(ctx context.Context) (dataplane.Counts, error) {
	select {
	case <-b.probed:
		return b.countingBackend.Programmed(ctx)
	case <-time.After(10 * time.Second):
		return dataplane.Counts{}, errors.New("no probe came while the backend was read back")
	}
}

// TestVerifyReadsBackAndProbesAtOnce: Verifying's read back and its
// probes, which only read and need nothing from each other, run at the
// same time (at 10 000 services each takes a few hundred milliseconds of
// every switch). The backend's read back here ends only once a probe has
// reached the service, inside a network namespace of the test's own.
func TestVerifyReadsBackAndProbesAtOnce(t *testing.T) {
	ns := netlab.NewNetNS(t, "verify")
	var ln net.Listener
	if err := ns.Do(func() (err error) { ln, err = net.Listen("tcp", "127.0.0.1:0"); return err }); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	probed := make(chan struct{})
	go func() {
		c, err := ln.Accept()
		if err == nil {
			c.Close()
			close(probed)
		}
	}()
	addr := netip.MustParseAddrPort(ln.Addr().String())
	name := model.ServicePortName{Namespace: "default", Name: "web", Port: "http", Protocol: corev1.ProtocolTCP}
	snap := &model.Snapshot{Ports: map[corev1.IPFamily]map[model.ServicePortName]*model.ServicePort{corev1.IPv4Protocol: {
		name: {Name: name, Family: corev1.IPv4Protocol, ClusterIP: addr.Addr(), Protocol: corev1.ProtocolTCP, Port: int32(addr.Port()),
			Endpoints: []model.Endpoint{{IP: addr.Addr(), Port: int32(addr.Port()), Ready: true, Serving: true}}},
	}}}

	ctx := context.Background()
	f := NewFanout()
	if _, err := f.Sync(ctx, dataplane.SyncRequest{Model: snap, Full: true}); err != nil {
		t.Fatal(err)
	}
	b := &probeWaitingBackend{countingBackend: countingBackend{mode: v1alpha1.ModeNFTables}, probed: probed}
	if _, err := f.Add(ctx, v1alpha1.ModeNFTables, b, "k"); err != nil {
		t.Fatal(err)
	}
	s := New(Config{Fanout: f, Prober: &probe.Prober{NS: ns.NS(), Attempts: 1}}, Desire{})
	if err := s.verify(ctx, Step{Action: Verify, Mode: v1alpha1.ModeNFTables}); err != nil {
		t.Errorf("verify: %v", err)
	}
}
