package switcher

import (
	"context"
	"errors"
	"testing"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
	"github.com/proxyshift/proxyshift/nodeagent/report"
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
