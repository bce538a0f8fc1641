package switcher

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"k8s.io/klog/v2"

	"github.com/proxyshift/proxyshift/api/contract"
	"github.com/proxyshift/proxyshift/api/v1alpha1"
	"github.com/proxyshift/proxyshift/nodeagent/dataplane"
	"github.com/proxyshift/proxyshift/nodeagent/facts"
	"github.com/proxyshift/proxyshift/nodeagent/probe"
	"github.com/proxyshift/proxyshift/nodeagent/report"
)

// Desire is what the node is asked to run.
type Desire struct {
	// Mode is the desired mode ("" for none).
	Mode v1alpha1.ProxyMode
	// Key identifies the effective settings the backends are built with;
	// a changed Key for the serving mode reconfigures it in place.
	Key string
	// Settings are the settings Key comes from, as the ProxyNode gives
	// them: reported (status.activeSettings) while an instance built with
	// Key serves, so that a restart can build the mode the same way.
	Settings *v1alpha1.ProxySettings
	// FromKey and FromSettings are the key and the settings Config.Backend
	// builds another mode with (the mode a resumed switch switches from,
	// as it served), reported as Settings are; FromKey "" for none.
	FromKey      string
	FromSettings *v1alpha1.ProxySettings
	// Scheduler is the IPVS scheduler (for preparing ipvs mode).
	Scheduler v1alpha1.IPVSScheduler
	// Config and Generation identify the spec (echoed in status).
	Config     *v1alpha1.ConfigReference
	Generation int64
	// Held says the switch to Mode already failed for this spec, as a
	// previous agent reported (status phase Failed with this generation).
	Held bool
	// HeldReason and HeldMessage are the previous agent's failure, kept
	// in status while the desire is held.
	HeldReason, HeldMessage string
	// Resume says a previous agent's last reported phase was in the
	// middle of a switch.
	Resume bool
	// KubeProxyStopped is the operator's word that kube-proxy's pod has
	// left the node (ProxyNode spec.kubeProxyStopped).
	KubeProxyStopped bool
	// Default says Mode is the agent's --mode, not a ProxyNode's
	// desire: it applies only to a node that nothing serves.
	Default bool
}

// KubeProxy is kube-proxy on the node (a *kubeproxy.Node).
type KubeProxy interface {
	// Mode is the mode of kube-proxy's objects in the kernel ("" none).
	Mode(ctx context.Context) (v1alpha1.ProxyMode, error)
	// Serving is nil once a running kube-proxy has synced its rules.
	Serving(ctx context.Context) error
	// Cleanup removes kube-proxy's leftovers.
	Cleanup(ctx context.Context) ([]string, error)
}

// Reporter receives the switch's state (a *report.Reporter).
type Reporter interface {
	SetSwitch(report.Switch)
	Flush(ctx context.Context) error
}

// Preparer makes sure the kernel can run a mode (a *facts.Gatherer).
type Preparer interface {
	Prepare(ctx context.Context, mode v1alpha1.ProxyMode, scheduler v1alpha1.IPVSScheduler) error
}

// Config is what a Switcher works with.
type Config struct {
	// Fanout is the backend set the sync loop drives.
	Fanout *Fanout
	// Backend builds the backend of a mode with the current settings and
	// returns the settings' key; it must not touch the kernel.
	Backend func(mode v1alpha1.ProxyMode) (dataplane.Backend, string, error)
	// Modes are the modes this agent has backends for.
	Modes   []v1alpha1.ProxyMode
	Prepare Preparer
	Prober  *probe.Prober
	// NodeIPs are the addresses NodePorts are probed on.
	NodeIPs func() []netip.Addr
	// ProbeServices and ProbeNodePorts bound the sample (default 8 and 2).
	ProbeServices, ProbeNodePorts int
	// KubeProxy is kube-proxy on the node: its objects are a mode of
	// their own in the protocol (v1alpha1.ModeKubeProxy), taken over
	// from and handed back to. Nil leaves kube-proxy out of sight.
	KubeProxy KubeProxy
	// KubeProxyPoll is how often kube-proxy is looked at while waiting
	// for it, and while idle (default 2s and 30s times 15).
	KubeProxyPoll time.Duration
	Report        Reporter
	// Events tells people what the switch does; nil tells nobody.
	Events Events
	// StopAt makes the switcher block forever once the work of this phase
	// is done and reported (a test hook for killing the agent there).
	StopAt v1alpha1.NodePhase
	// FailVerify makes every Verifying fail (a test hook).
	FailVerify bool
	// FailHandBackInto makes handing the node back to kube-proxy fail
	// while kube-proxy's objects are of this mode, once it serves and
	// before proxyshift's objects go (a test hook).
	FailHandBackInto v1alpha1.ProxyMode
}

// Switcher carries out Next's steps.
type Switcher struct {
	cfg Config

	mu      sync.Mutex
	desire  Desire
	changed chan struct{}
	// decidedBy is the desire the current state was decided from (set
	// by Init and Run only): reports carry its config and generation, not
	// those of a desire that arrived since and has not been acted on yet.
	decidedBy Desire

	// failedGen is the generation whose switch failed; failedKey its
	// mode and settings.
	failed    bool
	failedGen int64
	failedKey string
	// failure is the last failure's reason and message.
	failure  *facts.Error
	warning  *facts.Error
	baseline []probe.Target
	// baselineSet says a baseline was taken (nil baseline then means
	// nothing answered through the old mode).
	baselineSet bool
	// replaced is the instance a reconfiguration replaced, for rollback,
	// and replacedKey the key it was built with.
	replaced    dataplane.Backend
	replacedKey string
	// settings are the Settings of each Key given in a desire that an
	// instance may have been built with (see activeSettings).
	settings map[string]*v1alpha1.ProxySettings
	// kubeProxyMode is the mode of kube-proxy's objects at the last
	// decision, for the report.
	kubeProxyMode v1alpha1.ProxyMode
}

// New returns a Switcher for the initial desire d.
func New(cfg Config, d Desire) *Switcher {
	if cfg.ProbeServices == 0 {
		cfg.ProbeServices = 8
	}
	if cfg.ProbeNodePorts == 0 {
		cfg.ProbeNodePorts = 2
	}
	if cfg.KubeProxyPoll == 0 {
		cfg.KubeProxyPoll = 2 * time.Second
	}
	s := &Switcher{cfg: cfg, desire: d, changed: make(chan struct{}, 1), settings: map[string]*v1alpha1.ProxySettings{}}
	s.learn(d)
	return s
}

// learn records the settings of the keys d gives. s.mu is held, or s
// not shared yet.
func (s *Switcher) learn(d Desire) {
	s.settings[d.Key] = d.Settings
	if d.FromKey != "" {
		s.settings[d.FromKey] = d.FromSettings
	}
}

// SetDesire changes what the node is asked to run.
func (s *Switcher) SetDesire(d Desire) {
	s.mu.Lock()
	same := sameDesire(s.desire, d)
	s.desire = d
	s.learn(d)
	s.mu.Unlock()
	if !same {
		select {
		case s.changed <- struct{}{}:
		default:
		}
	}
}

// sameDesire compares desires by value (Config and Settings are
// pointers; Settings are told apart by Key).
func sameDesire(a, b Desire) bool {
	ac, bc := a.Config, b.Config
	a.Config, b.Config = nil, nil
	a.Settings, b.Settings = nil, nil
	a.FromSettings, b.FromSettings = nil, nil
	if a != b || (ac == nil) != (bc == nil) {
		return false
	}
	return ac == nil || *ac == *bc
}

func (s *Switcher) currentDesire() Desire {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.desire
}

// Present says which modes the kernel holds objects of.
func (s *Switcher) Present(ctx context.Context) ([]v1alpha1.ProxyMode, error) {
	var out []v1alpha1.ProxyMode
	for _, m := range s.cfg.Modes {
		b, _, ok := s.cfg.Fanout.Member(m)
		if !ok {
			var err error
			if b, _, err = s.cfg.Backend(m); err != nil {
				// A backend that cannot even be built here (its tools are
				// missing) cannot have programmed anything through them.
				klog.V(2).InfoS("Cannot look for a mode's objects: its backend cannot be built here", "mode", m, "err", err)
				continue
			}
		}
		ok, err := present(ctx, b)
		if err != nil {
			return nil, fmt.Errorf("find out whether %s is programmed: %w", m, err)
		}
		if ok {
			out = append(out, m)
		}
	}
	if s.cfg.KubeProxy != nil {
		mode, err := s.cfg.KubeProxy.Mode(ctx)
		if err != nil {
			return nil, fmt.Errorf("look for kube-proxy's objects: %w", err)
		}
		s.mu.Lock()
		s.kubeProxyMode = mode
		s.mu.Unlock()
		if mode != "" {
			out = append(out, v1alpha1.ModeKubeProxy)
		}
	}
	return out, nil
}

// Presence is what a backend implements to say whether the kernel holds
// any object of it, even one no sync of this process made.
type Presence interface {
	Present(ctx context.Context) (bool, error)
}

func present(ctx context.Context, b dataplane.Backend) (bool, error) {
	if p, ok := b.(Presence); ok {
		return p.Present(ctx)
	}
	c, err := b.Programmed(ctx)
	return c != (dataplane.Counts{}), err
}

// input gathers a decision's input.
func (s *Switcher) input(ctx context.Context, first bool) (Input, Desire, error) {
	d := s.currentDesire()
	present, err := s.Present(ctx)
	if err != nil {
		return Input{}, d, err
	}
	in := Input{Desired: d.Mode, Present: present, Resume: first && d.Resume, KubeProxyStopped: d.KubeProxyStopped}
	if d.Default && len(present) > 0 {
		// --mode is for a node nothing serves: this one keeps what it has.
		in.Desired = ""
	}
	s.mu.Lock()
	in.Held = d.Held || (s.failed && s.failedGen == d.Generation && s.failedKey == string(d.Mode)+"|"+d.Key)
	s.mu.Unlock()
	if d.Mode != "" && slices.Contains(present, d.Mode) {
		if _, key, ok := s.cfg.Fanout.Member(d.Mode); ok && key != d.Key {
			in.Reconfigure = true
		}
	}
	return in, d, nil
}

// Init makes the first decision and sets up the Fanout's members for it,
// before the sync loop starts: every mode present stays programmed
// (and is fully synced by the loop's first sync), except a target whose
// switch failed, which is rolled back. It returns the state to pass to
// Run.
func (s *Switcher) Init(ctx context.Context) (State, Step, error) {
	in, d, err := s.input(ctx, true)
	if err != nil {
		return State{}, Step{}, err
	}
	if d.Held {
		s.mu.Lock()
		s.failed, s.failedGen, s.failedKey = true, d.Generation, string(d.Mode)+"|"+d.Key
		s.failure = &facts.Error{Reason: d.HeldReason, Message: d.HeldMessage}
		if s.failure.Reason == "" {
			s.failure = &facts.Error{Reason: "SwitchFailed", Message: fmt.Sprintf("the switch to %s failed before the agent restarted; change the spec to try again", d.Mode)}
		}
		s.mu.Unlock()
	}
	st, step := Next(State{}, in, None)
	s.decidedBy = d
	for _, m := range in.Present {
		if step.Action == Rollback && m == step.Mode && step.Restore != m || m == v1alpha1.ModeKubeProxy {
			continue
		}
		b, key, err := s.cfg.Backend(m)
		if err != nil {
			return st, step, fmt.Errorf("%s: %w", m, err)
		}
		if _, err := s.cfg.Fanout.Add(ctx, m, b, key); err != nil {
			return st, step, err
		}
	}
	s.cfg.Fanout.SetPrimary(programmed(Serving(in.Present)))
	if step.Action == Serve {
		s.cfg.Fanout.SetPrimary(programmed(step.Mode))
	}
	klog.InfoS("Switcher starting", "present", in.Present, "desired", in.Desired, "phase", st.Phase, "next", step.Action, "held", in.Held, "resume", in.Resume)
	return st, step, nil
}

// Run carries out the steps, starting from Init's decision, until ctx
// ends. It waits for the Fanout's first sync (the model) before the
// first step.
func (s *Switcher) Run(ctx context.Context, st State, step Step) error {
	select {
	case <-ctx.Done():
		return nil
	case <-s.cfg.Fanout.Ready():
	}
	// The phase the agent found the node in is not news, unless it is
	// a switch to finish.
	told := st.Phase
	if Switching(st.Phase) {
		told = ""
	}
	for {
		s.report(ctx, st, step)
		if st.Phase != told {
			s.tellPhase(st, step)
			told = st.Phase
		}
		if s.cfg.StopAt != "" && st.Phase == s.cfg.StopAt && Switching(st.Phase) {
			// Do the phase's work, report it, then hang for the test to
			// kill the process.
			res := s.execute(ctx, st, step)
			klog.InfoS("Test hook: stopping at phase", "phase", st.Phase, "result", res)
			s.flush(ctx)
			<-ctx.Done()
			return nil
		}
		res := s.execute(ctx, st, step)
		if ctx.Err() != nil {
			return nil
		}
		if step.Action == Serve || step.Action == Wait {
			if !s.wait(ctx, st) {
				return nil
			}
			res = None
		}
		var in Input
		var d Desire
		var err error
		for {
			if in, d, err = s.input(ctx, false); err == nil {
				break
			}
			klog.ErrorS(err, "Could not read what the kernel holds; retrying")
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(time.Second):
			}
		}
		prev := st
		st, step = Next(st, in, res)
		s.decidedBy = d
		if st.Phase != prev.Phase || step.Action != Serve {
			klog.InfoS("Switch step", "from", prev.Phase, "phase", st.Phase, "action", step.Action, "mode", step.Mode, "remove", step.Remove, "restore", step.Restore, "present", in.Present, "desired", in.Desired)
		}
	}
}

// wait blocks until the desire changes or ctx ends. While the node
// serves nothing of proxyshift's (Idle), or waits for kube-proxy, it also
// returns when kube-proxy's objects come or go, so the report follows
// them: it looks every 15 polls when idle, every poll when waiting.
func (s *Switcher) wait(ctx context.Context, st State) bool {
	var tick <-chan time.Time
	if s.cfg.KubeProxy != nil && (st.Phase == v1alpha1.NodeIdle || st.Phase == v1alpha1.NodeWaitingForKubeProxy) {
		every := s.cfg.KubeProxyPoll
		if st.Phase == v1alpha1.NodeIdle {
			every *= 15
		}
		t := time.NewTicker(every)
		defer t.Stop()
		tick = t.C
	}
	s.mu.Lock()
	was := s.kubeProxyMode
	s.mu.Unlock()
	for {
		select {
		case <-ctx.Done():
			return false
		case <-s.changed:
			return true
		case <-tick:
			mode, err := s.cfg.KubeProxy.Mode(ctx)
			if err == nil && mode != was {
				return true
			}
		}
	}
}

func (s *Switcher) flush(ctx context.Context) {
	fctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := s.cfg.Report.Flush(fctx); err != nil {
		klog.ErrorS(err, "Could not write the switch phase to status; going on")
	}
}

// report hands the state to the reporter and writes it out (within a
// few seconds: an unreachable API server does not stop a switch). The
// config and generation reported are those the state was decided from:
// a spec that changed meanwhile is reported once it is acted on, so the
// operator never reads the end of an older switch as its answer.
func (s *Switcher) report(ctx context.Context, st State, step Step) {
	d := s.decidedBy
	r := report.Switch{Phase: st.Phase, Target: st.Target, Config: d.Config, Generation: d.Generation}
	s.mu.Lock()
	r.KubeProxyMode = s.kubeProxyMode
	s.mu.Unlock()
	switch {
	case Switching(st.Phase):
		r.Active = st.Previous
	default:
		r.Active = st.Target
	}
	r.Settings = s.activeSettings(r.Active, step)
	s.mu.Lock()
	if st.Phase == v1alpha1.NodeFailed && s.failure != nil {
		r.Reason, r.Message = s.failure.Reason, s.failure.Message
		r.Generation = s.failedGen
	}
	if st.Phase == v1alpha1.NodeActive && s.warning != nil {
		r.WarningReason, r.WarningMessage = s.warning.Reason, s.warning.Message
	}
	s.mu.Unlock()
	if s.cfg.Report != nil {
		s.cfg.Report.SetSwitch(r)
		s.flush(ctx)
	}
}

// activeSettings are the settings the instance of active runs with
// once step is done: a rollback of a reconfiguration puts back the
// instance it replaced. They are found by the key the instance was built
// with; nil when active is not a mode of proxyshift's serving, or the key
// is unknown. Settings of keys no instance or desire has any more are
// forgotten.
func (s *Switcher) activeSettings(active v1alpha1.ProxyMode, step Step) *v1alpha1.ProxySettings {
	if s.cfg.Fanout == nil {
		return nil
	}
	members := s.cfg.Fanout.Keys()
	activeKey, found := members[active]
	keys := map[string]bool{}
	for _, key := range members {
		keys[key] = true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if step.Action == Rollback && step.Restore == step.Mode && step.Mode == active && s.replaced != nil {
		activeKey, found = s.replacedKey, true
	}
	keys[s.desire.Key], keys[s.decidedBy.Key], keys[s.replacedKey], keys[s.desire.FromKey] = true, true, true, true
	for k := range s.settings {
		if !keys[k] {
			delete(s.settings, k)
		}
	}
	if !found {
		return nil
	}
	return s.settings[activeKey].DeepCopy()
}

// execute runs one step and says how it went.
func (s *Switcher) execute(ctx context.Context, st State, step Step) Result {
	var err error
	switch step.Action {
	case Wait:
		return None
	case Serve:
		err = s.serve(ctx, step.Mode)
		if err != nil {
			klog.ErrorS(err, "Could not set up the serving mode", "mode", step.Mode)
		}
		return None
	case Prepare:
		err = s.prepare(ctx, st, step)
	case AwaitKubeProxy:
		if !s.awaitKubeProxy(ctx, st, step) {
			return None
		}
	case Program:
		err = s.program(ctx, step)
	case Verify:
		err = s.verify(ctx, step)
	case CleanUp:
		if err = s.failHandBack(step); err == nil {
			err = s.cleanUp(ctx, st, step)
		}
	case Rollback:
		err = s.rollback(ctx, step)
		if err != nil {
			klog.ErrorS(err, "Rollback did not complete", "target", step.Mode, "restore", step.Restore)
			s.mu.Lock()
			if s.failure != nil {
				s.failure.Message += "; rolling back also failed: " + err.Error()
			}
			s.mu.Unlock()
		}
		return Succeeded
	}
	if ctx.Err() != nil {
		return None
	}
	if err != nil {
		fe := &facts.Error{}
		if !errors.As(err, &fe) {
			fe = &facts.Error{Reason: reasonFor(step.Action), Message: err.Error()}
		}
		d := s.decidedBy // the failed step was decided from it, whatever arrived since
		if st.Previous != "" {
			fe.Message += fmt.Sprintf("; %s keeps serving", st.Previous)
		}
		klog.ErrorS(err, "Switch failed", "phase", st.Phase, "target", step.Mode, "previous", st.Previous)
		s.mu.Lock()
		s.failed, s.failedGen, s.failedKey = true, d.Generation, string(d.Mode)+"|"+d.Key
		s.failure = fe
		s.mu.Unlock()
		s.tellFailure(st, step, fe)
		return Failed
	}
	return Succeeded
}

func reasonFor(a Action) string {
	switch a {
	case Program:
		return contract.ReasonProgrammingFailed
	case Verify:
		return contract.ReasonVerificationFailed
	case CleanUp:
		return contract.ReasonCleanupFailed
	}
	return "SwitchFailed"
}

// programmed is the Fanout member that serves when mode does: none for
// kube-proxy, whose rules the agent never programs.
func programmed(mode v1alpha1.ProxyMode) v1alpha1.ProxyMode {
	if mode == v1alpha1.ModeKubeProxy {
		return ""
	}
	return mode
}

// serve makes mode the primary member, adding it if needed, and
// forgets what a finished switch kept for rollback. kube-proxy serving
// leaves the Fanout without a primary.
func (s *Switcher) serve(ctx context.Context, mode v1alpha1.ProxyMode) error {
	s.mu.Lock()
	s.replaced, s.replacedKey = nil, ""
	s.mu.Unlock()
	if mode == v1alpha1.ModeKubeProxy {
		s.cfg.Fanout.SetPrimary("")
		return nil
	}
	if _, _, ok := s.cfg.Fanout.Member(mode); !ok {
		b, key, err := s.cfg.Backend(mode)
		if err != nil {
			return err
		}
		if _, err := s.cfg.Fanout.Add(ctx, mode, b, key); err != nil {
			return err
		}
	}
	s.cfg.Fanout.SetPrimary(mode)
	return nil
}

// prepare takes the probe baseline through the mode that serves, then
// loads the target's modules (failing closed).
func (s *Switcher) prepare(ctx context.Context, st State, step Step) error {
	s.mu.Lock()
	s.failure, s.warning, s.baseline, s.baselineSet = nil, nil, nil, false
	s.mu.Unlock()
	if st.Previous != "" && st.Previous != step.Mode {
		targets := s.targets()
		answered := probe.Answered(s.cfg.Prober.Probe(ctx, targets))
		s.mu.Lock()
		s.baseline, s.baselineSet = answered, true
		s.mu.Unlock()
		klog.InfoS("Probe baseline through the serving mode", "mode", st.Previous, "targets", len(targets), "answered", len(answered))
	}
	if step.Mode == v1alpha1.ModeKubeProxy {
		if s.cfg.KubeProxy == nil {
			return &facts.Error{Reason: contract.ReasonKubeProxyUnknown, Message: "this agent does not look for kube-proxy on its node, so it cannot hand the node back to it"}
		}
		return nil // kube-proxy's pod loads what its mode needs
	}
	return s.cfg.Prepare.Prepare(ctx, step.Mode, s.decidedBy.Scheduler)
}

// awaitKubeProxy waits, handing the node back, until kube-proxy serves it
// (its pod is back and has synced), looking every KubeProxyPoll and
// saying in the log what it still waits for, and in the status the mode
// of kube-proxy's objects as they appear. It returns false, with nothing
// done, when the desire changes or ctx ends first; the node timeout of
// the operator bounds the wait.
func (s *Switcher) awaitKubeProxy(ctx context.Context, st State, step Step) bool {
	start, last := time.Now(), ""
	for {
		if mode, err := s.cfg.KubeProxy.Mode(ctx); err == nil {
			s.mu.Lock()
			changed := mode != s.kubeProxyMode
			s.kubeProxyMode = mode
			s.mu.Unlock()
			if changed {
				s.report(ctx, st, step)
			}
		}
		err := s.cfg.KubeProxy.Serving(ctx)
		if err == nil {
			took := time.Since(start).Round(time.Millisecond)
			klog.InfoS("kube-proxy serves the node again", "after", took)
			s.tell(false, EventKubeProxyServing, step.Mode, "kube-proxy synced its rules and serves the node again (after %s); removing %s next", took, orNothing(st.Previous))
			return true
		}
		if msg := err.Error(); msg != last {
			klog.InfoS("Waiting for kube-proxy to serve the node before removing proxyshift's rules", "why", msg)
			last = msg
		}
		select {
		case <-ctx.Done():
			return false
		case <-s.changed:
			// Put the signal back for Run's next wait.
			select {
			case s.changed <- struct{}{}:
			default:
			}
			if !sameDesire(s.currentDesire(), s.decidedBy) {
				return false
			}
		case <-time.After(s.cfg.KubeProxyPoll):
		}
	}
}

func (s *Switcher) targets() []probe.Target {
	var ips []netip.Addr
	if s.cfg.NodeIPs != nil {
		ips = s.cfg.NodeIPs()
	}
	return probe.Targets(s.cfg.Fanout.Model(), ips, s.cfg.ProbeServices, s.cfg.ProbeNodePorts)
}

// program builds the target with the current settings and fully syncs
// it into the kernel while the old mode keeps serving.
func (s *Switcher) program(ctx context.Context, step Step) error {
	b, key, err := s.cfg.Backend(step.Mode)
	if err != nil {
		return err
	}
	_, oldKey, _ := s.cfg.Fanout.Member(step.Mode)
	old, err := s.cfg.Fanout.Add(ctx, step.Mode, b, key)
	if err != nil {
		return err
	}
	if old != nil {
		s.mu.Lock()
		if s.replaced == nil {
			s.replaced, s.replacedKey = old, oldKey
		}
		s.mu.Unlock()
	}
	return nil
}

// verify checks the target's objects against its last sync and probes
// the services that answered through the old mode (all sampled ones
// when there was none). The two only read, and neither needs the other:
// they run at once (each takes a few hundred milliseconds at 10 000
// services, and Verifying is part of every switch), and a read-back that
// fails stops the probes. The read-back's error comes first.
func (s *Switcher) verify(ctx context.Context, step Step) error {
	start := time.Now()
	probeCtx, stopProbes := context.WithCancel(ctx)
	defer stopProbes()
	checked := make(chan error, 1)
	var checkTook time.Duration
	go func() {
		err := s.cfg.Fanout.Check(ctx, step.Mode)
		checkTook = time.Since(start)
		if err != nil {
			stopProbes()
		}
		checked <- err
	}()
	probed := s.probeRequired(probeCtx, step.Mode)
	probesTook := time.Since(start)
	if err := <-checked; err != nil {
		return err
	}
	klog.V(2).InfoS("Read back and probed", "mode", step.Mode, "readBack", checkTook, "probes", probesTook)
	if probed != nil {
		return probed
	}
	if s.cfg.FailVerify {
		return errors.New("verification failed on purpose: the agent runs with --test-fail-verify")
	}
	return nil
}

// probeRequired probes the sampled targets. With a baseline (a mode
// served before the switch), every target that answered through the old
// mode must answer now: a mode that loses a service fails. Without one
// (the node ran no mode), at least one target must answer, proving the
// new mode translates; targets that do not are logged, since nothing
// says they ever worked (an endpoint the node cannot reach, say).
//
// Endpoints come and go while a node switches (a pod is replaced, an
// operator restarts): a baseline target that does not answer is looked
// at again up to verifyRechecks times, a second apart, from the model as
// it is then (a deleted pod's process can stop answering seconds before
// its endpoint's terminating state reaches the model). One whose
// service port has no endpoints now, or other endpoints than at the
// baseline, is excused (the old mode would not answer as before either);
// the others are probed again, and fail the switch if they still do not
// answer.
// verifyRechecks is how many times probeRequired looks again, a second
// apart, at baseline targets that do not answer.
const verifyRechecks = 5

func (s *Switcher) probeRequired(ctx context.Context, mode v1alpha1.ProxyMode) error {
	targets := s.targets()
	s.mu.Lock()
	baselineSet := s.baselineSet
	baseline := map[netip.AddrPort]probe.Target{}
	for _, b := range s.baseline {
		baseline[b.Addr] = b
	}
	s.mu.Unlock()
	if baselineSet {
		targets = slices.DeleteFunc(targets, func(t probe.Target) bool { _, ok := baseline[t.Addr]; return !ok })
	}
	for round := 0; ; round++ {
		results := s.cfg.Prober.Probe(ctx, targets)
		f := probe.Failures(results)
		switch {
		case f == "":
			return nil
		case !baselineSet && len(probe.Answered(results)) == 0:
			return fmt.Errorf("no service answered from the node with %s programmed: %s", mode, f)
		case !baselineSet:
			klog.InfoS("Some services did not answer from the node (no earlier mode to compare with)", "mode", mode, "failures", f)
			return nil
		case round == verifyRechecks:
			return fmt.Errorf("services that answered before did not answer from the node with %s programmed: %s", mode, f)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
		now := map[netip.AddrPort]probe.Target{}
		for _, t := range s.targets() {
			now[t.Addr] = t
		}
		targets = nil
		for _, r := range results {
			if r.Err == nil {
				continue
			}
			cur, ok := now[r.Target.Addr]
			if !ok || cur.Endpoints != baseline[r.Target.Addr].Endpoints {
				klog.InfoS("A service that answered before does not answer now, but its endpoints changed since: not counted", "target", r.Target, "err", r.Err)
				continue
			}
			targets = append(targets, cur)
		}
		if len(targets) == 0 {
			return nil
		}
	}
}

// failHandBack is the FailHandBackInto test hook.
func (s *Switcher) failHandBack(step Step) error {
	s.mu.Lock()
	kp := s.kubeProxyMode
	s.mu.Unlock()
	if step.Mode == v1alpha1.ModeKubeProxy && s.cfg.FailHandBackInto != "" && kp == s.cfg.FailHandBackInto {
		return fmt.Errorf("handing the node back to kube-proxy in %s mode failed on purpose: the agent runs with --test-fail-hand-back-into=%s", kp, kp)
	}
	return nil
}

// cleanUp removes the other modes (each stops being synced first;
// kube-proxy's leftovers through KubeProxy, where a failure is a warning,
// not a failed switch: the target serves) and probes again when that
// moved new connections to the target.
func (s *Switcher) cleanUp(ctx context.Context, st State, step Step) error {
	for _, m := range step.Remove {
		if m == v1alpha1.ModeKubeProxy {
			removed, err := s.cfg.KubeProxy.Cleanup(ctx)
			logRemoved("Removed kube-proxy's leftovers", removed)
			s.tellRemoved(EventKubeProxyRemoved, step.Mode, "kube-proxy's leftovers", removed)
			if err != nil {
				w := &facts.Error{Reason: contract.ReasonKubeProxyLeftovers, Message: "removing kube-proxy's leftovers failed: " + err.Error()}
				s.mu.Lock()
				s.warning = w
				s.mu.Unlock()
				s.tell(true, w.Reason, step.Mode, "%s", w.Message)
			}
			continue
		}
		b := s.cfg.Fanout.Remove(m)
		if b == nil {
			var err error
			if b, _, err = s.cfg.Backend(m); err != nil {
				return err
			}
		}
		removed, err := b.Cleanup(ctx)
		logRemoved("Removed the old mode", removed, "mode", m)
		s.tellRemoved(EventCleanedUp, step.Mode, "the objects of "+string(m), removed)
		if err != nil {
			return fmt.Errorf("remove %s: %w", m, err)
		}
	}
	s.cfg.Fanout.SetPrimary(programmed(step.Mode))
	if step.Cutover {
		if err := s.probeRequired(ctx, step.Mode); err != nil {
			return fmt.Errorf("after removing %s: %w", strings.Join(modeNames(step.Remove), ", "), err)
		}
	}
	return nil
}

func modeNames(ms []v1alpha1.ProxyMode) []string {
	var out []string
	for _, m := range ms {
		out = append(out, string(m))
	}
	return out
}

// rollback leaves step.Restore serving, fully synced, then removes the
// target. Restore == Mode keeps the mode, with the instance a
// reconfiguration replaced; Restore "" keeps the target (nothing else
// could serve). kube-proxy is never programmed nor removed here: restoring
// it removes the target from in front of its rules, and a failed hand-back
// leaves them behind the restored mode.
func (s *Switcher) rollback(ctx context.Context, step Step) error {
	switch {
	case step.Restore == "":
		s.cfg.Fanout.SetPrimary(programmed(step.Mode))
		return nil
	case step.Restore == v1alpha1.ModeKubeProxy:
		s.cfg.Fanout.SetPrimary("")
		return s.removeTarget(ctx, step)
	case step.Restore == step.Mode:
		s.mu.Lock()
		old, key := s.replaced, s.replacedKey
		s.replaced, s.replacedKey = nil, ""
		s.mu.Unlock()
		if old != nil {
			// Back with the key of its settings: they serve again, and a
			// spec that returns to them has nothing to change.
			if _, err := s.cfg.Fanout.Add(ctx, step.Mode, old, key); err != nil {
				return err
			}
		}
		s.cfg.Fanout.SetPrimary(step.Mode)
		return nil
	}
	var err error
	if _, _, ok := s.cfg.Fanout.Member(step.Restore); ok {
		err = s.cfg.Fanout.Resync(ctx, step.Restore)
	} else {
		var b dataplane.Backend
		var key string
		if b, key, err = s.cfg.Backend(step.Restore); err == nil {
			_, err = s.cfg.Fanout.Add(ctx, step.Restore, b, key)
		}
	}
	if err != nil {
		return fmt.Errorf("program %s again: %w", step.Restore, err)
	}
	s.cfg.Fanout.SetPrimary(step.Restore)
	if step.Mode == v1alpha1.ModeKubeProxy {
		return nil
	}
	return s.removeTarget(ctx, step)
}

// removeTarget removes the failed target of a rollback.
func (s *Switcher) removeTarget(ctx context.Context, step Step) error {
	b := s.cfg.Fanout.Remove(step.Mode)
	if b == nil {
		var err error
		if b, _, err = s.cfg.Backend(step.Mode); err != nil {
			return err
		}
	}
	removed, err := b.Cleanup(ctx)
	logRemoved("Rolled back: removed the failed target", removed, "mode", step.Mode, "serving", step.Restore)
	s.tellRemoved(EventRolledBack, step.Mode, "the objects of the failed target "+string(step.Mode), removed)
	if err != nil {
		return fmt.Errorf("remove %s: %w", step.Mode, err)
	}
	return nil
}
