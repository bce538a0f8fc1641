package bench

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
	"github.com/proxyshift/proxyshift/test/controlplane"
	"github.com/proxyshift/proxyshift/test/testenv"
)

// OperatorUser is the API user the operator runs as in the benchmark; the
// audit log records its writes and nobody else's.
const OperatorUser = "proxyshift-operator"

// OperatorPlan is one run of the operator benchmark: the shipped operator
// binary against a real API server holding Nodes simulated (Node objects,
// no kubelet) with simulated agents (simAgents), moved from iptables to
// nftables by one ProxyConfig.
type OperatorPlan struct {
	// Nodes is how many Nodes the cluster has.
	Nodes int
	// Operator is the proxyshift-operator binary (cmd/operator).
	Operator string
	// Assets holds kube-apiserver and etcd.
	Assets string
	// Dir is where the run keeps its files (the API server's, the
	// audit log, the operator's log).
	Dir string
	// MaxUnavailable is the ProxyConfig's spec.rollout.maxUnavailable;
	// everything else of its rollout policy is left to the defaults.
	MaxUnavailable intstr.IntOrString
	// SwitchTime and SwitchJitter are how long a simulated agent takes to
	// switch: SwitchTime plus up to SwitchJitter.
	SwitchTime, SwitchJitter time.Duration
	// Timeout bounds each of the install (every ProxyNode created and
	// reported) and the rollout (from the ProxyConfig's creation to
	// Completed).
	Timeout time.Duration
	// Logf prints progress.
	Logf func(format string, args ...any)
}

// OperatorResult is what one run measured.
type OperatorResult struct {
	Plan OperatorPlan
	// Args is the operator's command line (after the binary).
	Args []string
	// Install is from starting the operator until every Node's ProxyNode
	// existed and its agent had reported; Rollout from creating the
	// ProxyConfig until its phase was Completed.
	Install, Rollout time.Duration
	// Status is the ProxyConfig's status at the end.
	Status v1alpha1.ProxyConfigStatus
	// Writes are the operator's API writes from the audit log, split at
	// the ProxyConfig's creation.
	Writes Writes
	// AgentWrites counts the simulated agents' status writes.
	AgentWrites int64
	// PeakRSS is the operator's VmHWM in bytes, read just before it was
	// stopped.
	PeakRSS int64
	// PeakHeap is the most Go heap in use (HeapInuse) seen by sampling it
	// every 2 seconds.
	PeakHeap uint64
	// Reconciles are controller-runtime's figures by controller name.
	Reconciles map[string]*Reconciles
	// LoadStart is the load average when the run started (the report
	// adds the one at its end).
	LoadStart string
	// Elapsed is the whole run, from starting the API server.
	Elapsed time.Duration
}

// HeapProfileName is the operator's heap profile at the Go heap's peak,
// in the run's directory.
const HeapProfileName = "operator-heap.pprof"

// simWriters is how many goroutines write the simulated agents' status:
// few enough that the agents alone do not saturate an API server sharing
// 2 cores (at 32, the operator's leader election Lease renewals timed out
// at load 20 and it stopped, as it must when it loses its Lease).
const simWriters = 8

// RunOperator runs the operator benchmark once and tears everything down.
func RunOperator(ctx context.Context, p OperatorPlan) (*OperatorResult, error) {
	began := time.Now()
	res := &OperatorResult{Plan: p, LoadStart: "load average " + loadAvg()}
	env, err := testenv.LaunchAudited(p.Assets, p.Dir, OperatorUser)
	if err != nil {
		return nil, err
	}
	defer env.Stop()
	cfg := *env.Config
	cfg.QPS, cfg.Burst = 5000, 10000
	c, err := client.NewWithWatch(&cfg, client.Options{Scheme: env.Scheme})
	if err != nil {
		return nil, err
	}

	start := time.Now()
	if err := createNodes(ctx, c, p.Nodes); err != nil {
		return nil, err
	}
	p.Logf("operator: %d Nodes created in %s", p.Nodes, time.Since(start).Round(time.Millisecond))

	actx, stopAgents := context.WithCancel(ctx)
	defer stopAgents()
	agents := newSimAgents(c, v1alpha1.ModeIPTables, p.SwitchTime, p.SwitchJitter, simWriters)
	listed := make(chan struct{})
	go agents.run(actx, simWriters, listed)
	select {
	case <-listed:
	case <-ctx.Done():
		return nil, ctx.Err()
	}

	op, err := startOperator(env, p)
	if err != nil {
		return nil, err
	}
	defer op.stop()
	res.Args = op.args
	hctx, stopHeap := context.WithCancel(ctx)
	defer stopHeap()
	peakHeap := op.pprof.watch(hctx, 2*time.Second, filepath.Join(p.Dir, HeapProfileName))

	start = time.Now()
	if err := waitUntil(ctx, op, p.Timeout, func() (bool, error) {
		return agents.ready.Load() >= int64(p.Nodes), nil
	}); err != nil {
		return nil, fmt.Errorf("waiting for every ProxyNode and its agent's first report (%d of %d): %w", agents.ready.Load(), p.Nodes, err)
	}
	res.Install = time.Since(start)
	p.Logf("operator: every ProxyNode created and reported in %s", res.Install.Round(time.Millisecond))

	pc := &v1alpha1.ProxyConfig{
		ObjectMeta: metav1.ObjectMeta{Name: "bench"},
		Spec: v1alpha1.ProxyConfigSpec{Mode: v1alpha1.ModeNFTables,
			Rollout: v1alpha1.RolloutPolicy{MaxUnavailable: &p.MaxUnavailable}},
	}
	split := time.Now()
	if err := c.Create(ctx, pc); err != nil {
		return nil, err
	}
	last := ""
	err = waitUntil(ctx, op, p.Timeout, func() (bool, error) {
		if err := c.Get(ctx, client.ObjectKeyFromObject(pc), pc); err != nil {
			return false, nil // the API server is busy; ask again
		}
		if s := fmt.Sprintf("%s %s", pc.Status.Phase, pc.Status.Nodes.Summary); s != last && pc.Status.Phase != "" {
			last = s
			p.Logf("operator: %s", s)
		}
		switch pc.Status.Phase {
		case v1alpha1.RolloutCompleted:
			return true, nil
		case v1alpha1.RolloutFailed:
			return false, fmt.Errorf("the rollout failed: %+v", pc.Status.Conditions)
		}
		return false, nil
	})
	res.Rollout = time.Since(split)
	res.Status = pc.Status
	if err != nil {
		return res, fmt.Errorf("rollout of %d nodes: %w\n%s", p.Nodes, err, op.tail())
	}
	time.Sleep(2 * time.Second) // the last events and status writes land
	res.AgentWrites = agents.writes.Load()

	stopHeap()
	res.PeakHeap = <-peakHeap
	if res.Reconciles, err = op.metrics(ctx); err != nil {
		return res, err
	}
	if res.PeakRSS, err = controlplane.PeakRSS(op.cmd.Process.Pid); err != nil {
		return res, err
	}
	op.stop()
	stopAgents()
	if err := env.Stop(); err != nil { // flushes the audit log
		return res, err
	}
	f, err := os.Open(filepath.Join(p.Dir, testenv.AuditLogName))
	if err != nil {
		return res, err
	}
	defer f.Close()
	if res.Writes, err = countWrites(f, split); err != nil {
		return res, fmt.Errorf("audit log: %w", err)
	}
	res.Elapsed = time.Since(began)
	return res, nil
}

// createNodes creates Nodes node-00000... with the labels a kubelet
// gives them, from 32 goroutines.
func createNodes(ctx context.Context, c client.Client, n int) error {
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	for g := 0; g < 32; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := g; i < n; i += 32 {
				name := fmt.Sprintf("node-%05d", i)
				node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
					"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
					"node.kubernetes.io/instance-type": "bench", "topology.kubernetes.io/zone": fmt.Sprintf("zone-%d", i%3),
				}}}
				if err := c.Create(ctx, node); err != nil {
					mu.Lock()
					if first == nil {
						first = fmt.Errorf("create Node %s: %w", name, err)
					}
					mu.Unlock()
					return
				}
			}
		}(g)
	}
	wg.Wait()
	return first
}

// operatorProcess is the running operator binary.
type operatorProcess struct {
	cmd        *exec.Cmd
	args       []string
	metricsURL string
	pprof      goHeap
	log        string
	exited     chan struct{}
	err        error
	once       sync.Once
}

// startOperator starts the binary with its shipped defaults except what
// running outside a cluster needs: a kubeconfig of its own user, the
// leader election Lease's namespace, local ports, and plain-HTTP metrics
// (the benchmark scrapes them without a token).
func startOperator(env *testenv.Env, p OperatorPlan) (*operatorProcess, error) {
	kubeconfig := filepath.Join(p.Dir, "operator.kubeconfig")
	if err := env.WriteUserKubeconfig(OperatorUser, []string{"system:masters"}, kubeconfig); err != nil {
		return nil, err
	}
	metricsAddr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	probeAddr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	pprofAddr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	args := []string{"--kubeconfig", kubeconfig, "--leader-election-namespace", "default",
		"--metrics-bind-address", metricsAddr, "--metrics-secure=false", "--health-probe-bind-address", probeAddr,
		"--pprof-bind-address", pprofAddr}
	op := &operatorProcess{args: args, log: filepath.Join(p.Dir, "operator.log"), exited: make(chan struct{})}
	logFile, err := os.Create(op.log)
	if err != nil {
		return nil, err
	}
	op.cmd = exec.Command(p.Operator, args...)
	op.cmd.Stdout, op.cmd.Stderr = logFile, logFile
	op.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // gone with the benchmark
	if err := controlplane.Spawn(op.cmd); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("start %s: %w", p.Operator, err)
	}
	go func() {
		op.err = op.cmd.Wait()
		logFile.Close()
		close(op.exited)
	}()
	op.metricsURL = "http://" + metricsAddr + "/metrics"
	op.pprof = goHeap{pprof: "http://" + pprofAddr, metrics: op.metricsURL}
	return op, nil
}

// metrics reads the reconcile figures from the operator's metrics.
func (op *operatorProcess) metrics(ctx context.Context) (map[string]*Reconciles, error) {
	body, err := httpGet(ctx, nil, op.metricsURL)
	if err != nil {
		return nil, fmt.Errorf("operator metrics: %w", err)
	}
	return reconcileMetrics(bytes.NewReader(body))
}

// stop ends the operator with SIGTERM (SIGKILL after 30 s), once.
func (op *operatorProcess) stop() {
	op.once.Do(func() {
		select {
		case <-op.exited:
			return
		default:
		}
		_ = op.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-op.exited:
		case <-time.After(30 * time.Second):
			_ = op.cmd.Process.Kill()
			<-op.exited
		}
	})
}

// tail is the end of the operator's log.
func (op *operatorProcess) tail() string {
	b, _ := os.ReadFile(op.log)
	if len(b) > 3000 {
		b = b[len(b)-3000:]
	}
	return "operator log (" + op.log + "):\n" + string(b)
}

// waitUntil polls cond twice a second until it holds, fails, the
// operator exits, or timeout passes.
func waitUntil(ctx context.Context, op *operatorProcess, timeout time.Duration, cond func() (bool, error)) error {
	deadline := time.After(timeout)
	for {
		ok, err := cond()
		if ok || err != nil {
			return err
		}
		select {
		case <-op.exited:
			return fmt.Errorf("the operator exited: %v\n%s", op.err, op.tail())
		case <-deadline:
			return fmt.Errorf("not within %s", timeout)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// freeAddr is a loopback address with a port nothing listens on now.
func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// loadAvg is the machine's load average over 1, 5 and 15 minutes.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return strings.Join(strings.Fields(string(b))[:3], " ")
}
