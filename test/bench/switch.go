package bench

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"syscall"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
)

// A mode switch is driven as the operator drives one: the benchmark
// writes the node's ProxyNode spec (desiredMode and a new configRef
// generation) and watches its status until the agent reports Active in
// the new mode for that generation. Meanwhile a prober in the node
// namespace opens new connections through the service rules and counts
// those that fail.

// SwitchConfigName is the configRef name the benchmark's ProxyNode specs
// carry (no ProxyConfig of that name exists: no operator runs).
const SwitchConfigName = "bench"

// ProxyNodes writes the benchmark node's ProxyNode spec and watches its
// status.
type ProxyNodes struct {
	c   client.WithWatch
	gen int64
}

// NewProxyNodes returns a ProxyNodes for the API server cfg reaches.
func NewProxyNodes(cfg *rest.Config) (*ProxyNodes, error) {
	scheme := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	c, err := client.NewWithWatch(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, err
	}
	return &ProxyNodes{c: c}, nil
}

// Remove deletes the node's ProxyNode.
func (p *ProxyNodes) Remove(ctx context.Context) error {
	err := p.c.Delete(ctx, &v1alpha1.ProxyNode{ObjectMeta: metav1.ObjectMeta{Name: NodeName}})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// Reset deletes the node's ProxyNode (status included) and creates it
// anew asking for mode, as the operator does for a node it manages: each
// run's agent starts on a fresh node and reads nothing a previous run's
// agent reported.
func (p *ProxyNodes) Reset(ctx context.Context, mode string) error {
	old := &v1alpha1.ProxyNode{ObjectMeta: metav1.ObjectMeta{Name: NodeName}}
	if err := p.c.Delete(ctx, old); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete ProxyNode: %w", err)
	}
	p.gen++
	pn := &v1alpha1.ProxyNode{
		ObjectMeta: metav1.ObjectMeta{Name: NodeName},
		Spec:       v1alpha1.ProxyNodeSpec{DesiredMode: v1alpha1.ProxyMode(mode), ConfigRef: &v1alpha1.ConfigReference{Name: SwitchConfigName, Generation: p.gen}},
	}
	for {
		err := p.c.Create(ctx, pn)
		if !apierrors.IsAlreadyExists(err) {
			if err != nil {
				return fmt.Errorf("create ProxyNode: %w", err)
			}
			return nil
		}
		// The deletion has not finished yet.
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// desire writes spec.desiredMode with a new configRef generation and
// returns the generation and the resource version written.
func (p *ProxyNodes) desire(ctx context.Context, mode string) (int64, string, error) {
	p.gen++
	for i := 0; ; i++ {
		pn := &v1alpha1.ProxyNode{}
		if err := p.c.Get(ctx, client.ObjectKey{Name: NodeName}, pn); err != nil {
			return 0, "", err
		}
		pn.Spec.DesiredMode = v1alpha1.ProxyMode(mode)
		pn.Spec.ConfigRef = &v1alpha1.ConfigReference{Name: SwitchConfigName, Generation: p.gen}
		err := p.c.Update(ctx, pn)
		if err == nil {
			return p.gen, pn.ResourceVersion, nil
		}
		if !apierrors.IsConflict(err) || i > 10 {
			return 0, "", fmt.Errorf("write ProxyNode spec: %w", err)
		}
	}
}

// PhaseAt is a phase the ProxyNode status showed, and when the watch
// saw it first, from the spec write.
type PhaseAt struct {
	Phase v1alpha1.NodePhase
	At    time.Duration
}

// Switch is one measured mode switch.
type Switch struct {
	From, To string
	// Took is from the spec write until the status says Active in To for
	// the written generation (what the operator waits for).
	Took time.Duration
	// Phases are the phases the status went through, in order.
	Phases []PhaseAt
}

// PreparingToActive is the time from the status first showing Preparing
// until Active (the switch as the agent reports it); Took when the
// watch never saw Preparing.
func (s Switch) PreparingToActive() time.Duration {
	for _, p := range s.Phases {
		if p.Phase == v1alpha1.NodePreparing {
			return s.Took - p.At
		}
	}
	return s.Took
}

// SwitchResult is the switches of one node, and the prober's count of
// new connections during them.
type SwitchResult struct {
	Services int
	Switches []Switch
	// Connects is the number of new connections the prober opened while
	// the switches ran; Failures those that got no answer (within
	// ProbeTimeout), FailureSample the first failures' errors.
	Connects, Failures int
	FailureSample      []string
	// Err says why the switches stopped early ("" when all were made).
	Err string
}

// Took lists the durations of the switches from one mode to another.
func (r *SwitchResult) Took(from, to string, preparing bool) []time.Duration {
	var out []time.Duration
	for _, s := range r.Switches {
		if s.From == from && s.To == to {
			if preparing {
				out = append(out, s.PreparingToActive())
			} else {
				out = append(out, s.Took)
			}
		}
	}
	return out
}

// switchTo waits until the node reports Active in from for the current
// generation (the agent may not have reported its last switch or its
// first sync yet), then writes the desire for mode and waits until the
// status reports Active in it for the new generation, recording the
// phases on the way. Both waits share timeout.
func (p *ProxyNodes) switchTo(ctx context.Context, from, mode string, timeout time.Duration) (Switch, error) {
	sw := Switch{From: from, To: mode}
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cur := &v1alpha1.ProxyNode{}
	if err := p.c.Get(wctx, client.ObjectKey{Name: NodeName}, cur); err != nil {
		return sw, err
	}
	if !activeFor(cur.Status, from, p.gen) {
		var err error
		if cur, err = p.follow(wctx, cur.ResourceVersion, from, p.gen); err != nil {
			return sw, fmt.Errorf("before the switch: %w", err)
		}
	}
	// Watch from before the write, so that no phase is missed.
	w, err := p.watch(wctx, cur.ResourceVersion)
	if err != nil {
		return sw, err
	}
	defer w.Stop()
	start := time.Now()
	gen, _, err := p.desire(ctx, mode)
	if err != nil {
		return sw, err
	}
	// Phases are recorded as they change from the one before the write
	// (the agent reports a phase before it echoes the new generation).
	last := cur.Status.Phase
	if _, err := p.followWatch(wctx, w, mode, gen, func(st v1alpha1.ProxyNodeStatus) {
		if st.Phase != last {
			last = st.Phase
			sw.Phases = append(sw.Phases, PhaseAt{Phase: st.Phase, At: time.Since(start)})
		}
	}); err != nil {
		return sw, err
	}
	sw.Took = time.Since(start)
	return sw, nil
}

// activeFor says whether st reports Active in mode for generation gen.
func activeFor(st v1alpha1.ProxyNodeStatus, mode string, gen int64) bool {
	return st.ObservedConfig != nil && st.ObservedConfig.Generation == gen &&
		st.Phase == v1alpha1.NodeActive && string(st.ActiveMode) == mode
}

// watch watches the node's ProxyNode from resource version rv.
func (p *ProxyNodes) watch(ctx context.Context, rv string) (watch.Interface, error) {
	w, err := p.c.Watch(ctx, &v1alpha1.ProxyNodeList{}, client.MatchingFields{"metadata.name": NodeName}, &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: rv}})
	if err != nil {
		return nil, fmt.Errorf("watch ProxyNode: %w", err)
	}
	return w, nil
}

// follow watches the node's ProxyNode from resource version rv until it
// reports Active in mode for generation gen; see followWatch.
func (p *ProxyNodes) follow(ctx context.Context, rv, mode string, gen int64) (*v1alpha1.ProxyNode, error) {
	w, err := p.watch(ctx, rv)
	if err != nil {
		return nil, err
	}
	defer w.Stop()
	return p.followWatch(ctx, w, mode, gen, nil)
}

// followWatch reads w until the ProxyNode reports Active in mode for
// generation gen and returns it, calling seen (when not nil) with every
// status on the way. It fails when the status reports Failed for gen,
// the watch ends, or ctx ends.
func (p *ProxyNodes) followWatch(ctx context.Context, w watch.Interface, mode string, gen int64, seen func(v1alpha1.ProxyNodeStatus)) (*v1alpha1.ProxyNode, error) {
	var lastStatus v1alpha1.ProxyNodeStatus
	for {
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%w: not Active in %s for generation %d: last status: phase %s, active %s, conditions %v",
				errTimeout, mode, gen, lastStatus.Phase, lastStatus.ActiveMode, lastStatus.Conditions)
		case ev, ok := <-w.ResultChan():
			if !ok {
				return nil, errors.New("the ProxyNode watch ended")
			}
			if ev.Type == watch.Error {
				return nil, fmt.Errorf("ProxyNode watch: %v", apierrors.FromObject(ev.Object))
			}
			pn, ok := ev.Object.(*v1alpha1.ProxyNode)
			if !ok {
				continue
			}
			st := pn.Status
			lastStatus = st
			if seen != nil {
				seen(st)
			}
			switch {
			case st.ObservedConfig == nil || st.ObservedConfig.Generation != gen:
				// not yet acted on
			case st.Phase == v1alpha1.NodeFailed:
				return nil, fmt.Errorf("the switch to %s failed: %v", mode, st.Conditions)
			case activeFor(st, mode, gen):
				return pn, nil
			}
		}
	}
}

// SwitchPlan says how the switches are measured.
type SwitchPlan struct {
	// Modes are walked in turn from the first, Rounds times, and back to
	// the first: nftables,iptables with 3 rounds is 3 switches each way.
	Modes  []string
	Rounds int
	// Timeout bounds each switch.
	Timeout time.Duration
	// ProbeEvery spaces the prober's new connections.
	ProbeEvery time.Duration
}

// ProbeTimeout bounds each of the prober's connections (connect and
// answer): a connection that takes longer counts as failed.
const ProbeTimeout = time.Second

// measureSwitches switches the node between the plan's modes while a
// prober opens new connections to a few of the n Services through the
// rules; the node must be Active in Modes[0].
func measureSwitches(ctx context.Context, node *Node, pns *ProxyNodes, sp SwitchPlan, n int, logf func(string, ...any)) (*SwitchResult, error) {
	res := &SwitchResult{Services: n}
	targets := []netip.AddrPort{ServiceAddr(FirstOrdinary()), ServiceAddr((FirstOrdinary() + LastOrdinary(n)) / 2), ServiceAddr(LastOrdinary(n))}
	pr := startProber(ctx, node, targets, sp.ProbeEvery, ProbeTimeout, nil)
	var err error
	from := sp.Modes[0]
	for range sp.Rounds {
		for i := range sp.Modes {
			to := sp.Modes[(i+1)%len(sp.Modes)]
			var sw Switch
			if sw, err = pns.switchTo(ctx, from, to, sp.Timeout); err != nil {
				err = fmt.Errorf("switch %s -> %s: %w", from, to, err)
				break
			}
			logf("switch %s -> %s at %d services: %s (Preparing -> Active %s), phases %s", from, to, n, round(sw.Took), round(sw.PreparingToActive()), phaseText(sw.Phases))
			res.Switches = append(res.Switches, sw)
			from = to
		}
		if err != nil {
			break
		}
	}
	pc := pr.stop()
	res.Connects, res.Failures, res.FailureSample = pc.Connects, pc.Failures, pc.Sample
	return res, err
}

func phaseText(ps []PhaseAt) string {
	s := ""
	for i, p := range ps {
		if i > 0 {
			s += " "
		}
		s += fmt.Sprintf("%s@%s", p.Phase, round(p.At))
	}
	return s
}

// prober opens a new connection every few milliseconds, round robin over
// its targets, each in its own goroutine (at most 32 at once), and
// counts those that fail, keeping the first few with the time each
// started.
type prober struct {
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	timeout time.Duration
	check   func(target netip.AddrPort, endpoint netip.Addr) error

	mu     sync.Mutex
	counts probeCounts
}

// probeCounts is what a prober saw.
type probeCounts struct {
	// Connects is the number of connections opened; Failures those that
	// failed, Refused the failures the backends refused (a connection
	// that reached them untranslated, where the lab makes service
	// addresses refuse), Sample the first failures' errors.
	Connects, Failures, Refused int
	Sample                      []string
	// Resent counts connections that got their answer but whose TCP
	// connect took a second or more: the first SYN, or its answer, was
	// lost and the kernel sent it again (its first retransmission
	// timeout is 1 s).
	Resent int
}

// startProber starts probing targets every so often, each connection
// given timeout to connect and answer. check, when not nil, judges each
// answer (the endpoint that answered the target); an error counts the
// connection as failed.
func startProber(ctx context.Context, node *Node, targets []netip.AddrPort, every, timeout time.Duration, check func(netip.AddrPort, netip.Addr) error) *prober {
	ctx, cancel := context.WithCancel(ctx)
	p := &prober{cancel: cancel, timeout: timeout, check: check}
	slots := make(chan struct{}, 32)
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		tick := time.NewTicker(every)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			select {
			case slots <- struct{}{}:
			case <-ctx.Done():
				return
			}
			target := targets[i%len(targets)]
			p.wg.Add(1)
			go func() {
				defer p.wg.Done()
				defer func() { <-slots }()
				// The answer is read with a context that outlives the
				// prober's stop: a connection started is counted.
				started := time.Now()
				ep, connect, err := node.Ask(context.WithoutCancel(ctx), target, p.timeout)
				if err == nil && p.check != nil {
					err = p.check(target, ep)
				}
				p.record(target, started, connect, err)
			}()
		}
	}()
	return p
}

// record counts one connection.
func (p *prober) record(target netip.AddrPort, started time.Time, connect time.Duration, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	c := &p.counts
	c.Connects++
	if err == nil {
		if connect >= time.Second {
			c.Resent++
		}
		return
	}
	c.Failures++
	if errors.Is(err, syscall.ECONNREFUSED) {
		c.Refused++
	}
	if len(c.Sample) < 5 {
		// The start's time of day, to find in the agent's log.
		c.Sample = append(c.Sample, fmt.Sprintf("%s (started %s UTC): %v", target, started.UTC().Format("15:04:05.000"), err))
	}
}

// stop ends the prober, waits for the connections under way, and
// returns the counts.
func (p *prober) stop() probeCounts {
	p.cancel()
	p.wg.Wait()
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.counts
}
