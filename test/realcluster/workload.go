package realcluster

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netns"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/proxyshift/proxyshift/test/controlplane"
	"github.com/proxyshift/proxyshift/test/harness"
	"github.com/proxyshift/proxyshift/test/netlab"
)

// The workload (manifests/web.yaml).
const (
	// WorkloadNamespace holds the Deployment and its Services.
	WorkloadNamespace = "demo"
	// WebService is the ClusterIP Service (port WebPort) and
	// WebNodePortService the NodePort one (WebNodePort on every node);
	// both select the Deployment's pods (label app=web).
	WebService         = "web"
	WebNodePortService = "web-nodeport"
	WebPort            = 80
	WebNodePort        = 30080
	// WebSelector selects the Deployment's pods.
	WebSelector = "app=web"
	// webReplicas is the Deployment's size.
	webReplicas = 3
	// KubeProxySelector selects kube-proxy's pods (kube-system).
	KubeProxySelector = "k8s-app=kube-proxy"
)

// podSet is a group of pods applyWorkloads waits for.
type podSet struct {
	file, namespace, selector string
	count                     int
}

// applyWorkloads applies kube-proxy's manifests and the workload's with
// kubectl, as a user would, and waits for their pods to run and be ready
// (one kube-proxy per node, the Deployment's replicas), noting how long
// each pod took from its creation to Running.
func (c *Cluster) applyWorkloads(ctx context.Context) error {
	var sets []podSet
	if !c.opts.NoKubeProxy {
		sets = append(sets, podSet{"kube-proxy.yaml", "kube-system", KubeProxySelector, len(c.Nodes)})
	}
	if !c.opts.NoWorkload {
		sets = append(sets, podSet{"web.yaml", WorkloadNamespace, WebSelector, webReplicas})
	}
	// Pods are watched from before the apply: a pod's creation is its
	// first sighting (polled every 100ms), its start the first sighting
	// Running (the API's timestamps have whole seconds only).
	var (
		mu      sync.Mutex
		ready   = map[string]int{}
		seen    = map[string]time.Time{}
		running = map[string]bool{}
		lastErr error
	)
	poll := func(ctx context.Context) {
		for _, set := range sets {
			pods, err := c.Kube.CoreV1().Pods(set.namespace).List(ctx, metav1.ListOptions{LabelSelector: set.selector})
			mu.Lock()
			if err != nil {
				lastErr = err
				mu.Unlock()
				continue
			}
			n := 0
			for _, p := range pods.Items {
				key := p.Namespace + "/" + p.Name
				if _, ok := seen[key]; !ok {
					seen[key] = time.Now()
				}
				if p.Status.Phase == corev1.PodRunning && !running[key] {
					running[key] = true
					d := time.Since(seen[key])
					c.Pods = append(c.Pods, harness.Timing{Step: fmt.Sprintf("%s on %s", key, p.Spec.NodeName), Duration: d})
					c.logf("  %-38s %6.2fs (%s)", key+" Running", d.Seconds(), p.Spec.NodeName)
				}
				if podReady(&p) {
					n++
				}
			}
			ready[set.selector] = n
			mu.Unlock()
		}
	}
	pollCtx, stopPoll := context.WithCancel(ctx)
	polled := make(chan struct{})
	go func() {
		defer close(polled)
		for pollCtx.Err() == nil {
			poll(pollCtx)
			select {
			case <-pollCtx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	defer func() { stopPoll(); <-polled }()

	for _, set := range sets {
		if _, err := c.Kubectl(ctx, "apply", "-f", filepath.Join(c.opts.RepoDir, "test", "realcluster", "manifests", set.file)); err != nil {
			return err
		}
	}
	ctx, cancel := context.WithTimeout(ctx, readyBudget)
	defer cancel()
	return controlplane.WaitFor(ctx, "pods running and ready", 100*time.Millisecond, c.Processes(), func(context.Context) error {
		mu.Lock()
		defer mu.Unlock()
		for _, set := range sets {
			if ready[set.selector] < set.count {
				return fmt.Errorf("%d of %d pods %s in %s ready (%v)", ready[set.selector], set.count, set.selector, set.namespace, lastErr)
			}
		}
		return nil
	})
}

func podReady(p *corev1.Pod) bool {
	for _, cond := range p.Status.Conditions {
		if cond.Type == corev1.PodReady {
			return cond.Status == corev1.ConditionTrue
		}
	}
	return false
}

// WebPods lists the pods the web Service selects (label app=web), by
// name, with their addresses.
func (c *Cluster) WebPods(ctx context.Context) (map[string]netip.Addr, error) {
	pods, err := c.Kube.CoreV1().Pods(WorkloadNamespace).List(ctx, metav1.ListOptions{LabelSelector: WebSelector})
	if err != nil {
		return nil, err
	}
	out := map[string]netip.Addr{}
	for _, p := range pods.Items {
		ip, _ := netip.ParseAddr(p.Status.PodIP)
		out[p.Name] = ip
	}
	return out, nil
}

// ClusterIP is the cluster IP of Service namespace/name.
func (c *Cluster) ClusterIP(ctx context.Context, namespace, name string) (netip.Addr, error) {
	svc, err := c.Kube.CoreV1().Services(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return netip.Addr{}, err
	}
	return netip.ParseAddr(svc.Spec.ClusterIP)
}

// Target is a place a request goes to and the namespace it leaves from.
type Target struct {
	// From names the source ("node-1", "client").
	From string
	NS   *netlab.NetNS
	Addr netip.AddrPort
}

// WebTargets lists the ways into the web Services: its cluster IP from
// every node and from the client, and the NodePort on every node from the
// client.
func (c *Cluster) WebTargets(ctx context.Context) ([]Target, error) {
	ip, err := c.ClusterIP(ctx, WorkloadNamespace, WebService)
	if err != nil {
		return nil, err
	}
	clusterAddr := netip.AddrPortFrom(ip, WebPort)
	var ts []Target
	for _, n := range c.Nodes {
		ts = append(ts, Target{From: n.Name, NS: n.NS, Addr: clusterAddr})
	}
	ts = append(ts, Target{From: "client", NS: c.Client, Addr: clusterAddr})
	for _, n := range c.Nodes {
		ts = append(ts, Target{From: "client", NS: c.Client, Addr: netip.AddrPortFrom(n.IP, WebNodePort)})
	}
	return ts, nil
}

// waitServices waits until every way into the web Services (WebTargets)
// has been answered by every one of the Deployment's pods: the pods
// become ready one by one, and each node's proxy learns of each on its own
// schedule, so one answer does not mean that a node serves them all.
func (c *Cluster) waitServices(ctx context.Context) error {
	targets, err := c.WebTargets(ctx)
	if err != nil {
		return err
	}
	pods, err := c.WebPods(ctx)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, servicesBudget)
	defer cancel()
	for _, t := range targets {
		answered := map[string]bool{}
		err := controlplane.WaitFor(ctx, fmt.Sprintf("%s from %s answered by every pod", t.Addr, t.From), 50*time.Millisecond, c.Processes(), func(context.Context) error {
			name, err := t.NS.Request(netlab.TCP, t.Addr, time.Second)
			if err != nil {
				return err
			}
			if _, ok := pods[name]; !ok {
				return fmt.Errorf("answered by %q, not one of the pods %v", name, slices.Sorted(maps.Keys(pods)))
			}
			answered[name] = true
			if len(answered) < len(pods) {
				return fmt.Errorf("answered by %v of %v so far", slices.Sorted(maps.Keys(answered)), slices.Sorted(maps.Keys(pods)))
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// PodNetNS opens the network namespace of pod namespace/name (found
// through a process of the pod: its cgroup path names the pod's UID), so
// a test can send traffic from inside a pod. The caller closes it.
func (c *Cluster) PodNetNS(ctx context.Context, namespace, name string) (*netlab.NetNS, func(), error) {
	pod, err := c.Kube.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, nil, err
	}
	if pod.Spec.HostNetwork {
		return nil, nil, fmt.Errorf("pod %s/%s uses its node's network namespace", namespace, name)
	}
	marker := "/pod" + string(pod.UID) + "/"
	procs, err := os.ReadDir("/proc")
	if err != nil {
		return nil, nil, err
	}
	for _, p := range procs {
		cg, err := os.ReadFile(filepath.Join("/proc", p.Name(), "cgroup"))
		if err != nil || !strings.Contains(string(cg), marker) {
			continue
		}
		h, err := netns.GetFromPath(filepath.Join("/proc", p.Name(), "ns", "net"))
		if err != nil {
			continue // exited meanwhile
		}
		return &netlab.NetNS{Name: "pod " + namespace + "/" + name, Handle: h}, func() { _ = h.Close() }, nil
	}
	return nil, nil, fmt.Errorf("no process of pod %s/%s (uid %s) found", namespace, name, pod.UID)
}
