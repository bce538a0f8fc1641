package realcluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/proxyshift/proxyshift/nodeagent/nsexec"
	"github.com/proxyshift/proxyshift/test/controlplane"
	"github.com/proxyshift/proxyshift/test/netlab"
)

// Node is one node: a network namespace on the fabric, and inside it a
// mount and a PID namespace of its own (held by Holder) where the node's
// containerd and kubelet run, in the node's cgroup.
//
// Why a mount namespace: containerd and the kubelet assume they own the
// machine's /run, /var/lib, /var/log and a few /proc/sys files. In the
// node's mount namespace per-node directories are bind-mounted over them,
// so three nodes share nothing and the host is never written (see mounts).
// It is a slave of the host's: the host's mounts reach the node, the
// node's (container root filesystems, pod volumes, pod network
// namespaces) never reach the host, and vanish with the namespace.
//
// Why a PID namespace: containerd's shims and the containers outlive
// containerd by design (they re-parent to the namespace's init). Here that
// init is the node's pause process: it reaps them, and when it dies the
// kernel kills every process of the node at once, which makes the
// teardown (and a crashed harness's, through unshare --kill-child) total.
type Node struct {
	// Name is the Node object's name ("node-1") and Index its number.
	Name  string
	Index int
	// IP is the node's fabric address (its InternalIP, where NodePorts
	// answer); PodCIDR its pod range.
	IP      netip.Addr
	PodCIDR netip.Prefix
	// NS is the node's network namespace (kubelet, containerd, kube-proxy
	// and every hostNetwork pod run there).
	NS *netlab.NetNS
	// Dir is the node's directory (configuration, containerd's and the
	// kubelet's state, the directories bind-mounted in the node).
	Dir string
	// Holder holds the node's mount and PID namespaces (unshare running
	// pause); Containerd and Kubelet run inside them.
	Holder, Containerd, Kubelet *controlplane.Process
	// ReadyAfter is how long the node took from the start of its bring-up
	// (namespaces, cgroups, containerd, image import, kubelet) to Ready.
	ReadyAfter time.Duration

	c     *Cluster
	cfg   nodeConfig
	cg    *cgroup
	init  int    // the host pid of the node's init (pause)
	pidNS string // its PID namespace ("pid:[4026532...]")
}

// nodeDirs are the node's directories bind-mounted over the host's inside
// the node's mount namespace (relative to Node.Dir → absolute path seen by
// the node's processes):
//   - run: containerd's shim sockets, runc's state, iptables' lock
//     (/run/xtables.lock, which kube-proxy's pod mounts), the CNI cache;
//   - var-lib: /var/lib/cni (CNI results) and anything else a component
//     keeps under /var/lib;
//   - var-log: /var/log/pods and /var/log/containers, the pods' logs.
var nodeDirs = []struct{ dir, target string }{
	{"run", "/run"},
	{"var-lib", "/var/lib"},
	{"var-log", "/var/log"},
}

// enter is the command line that runs a program in the node's mount,
// network and PID namespaces.
func (n *Node) enter() []string {
	return []string{"nsenter", "-t", strconv.Itoa(n.init), "-m", "-n", "-p", "--"}
}

// Exec runs a command inside the node's mount, network and PID namespaces
// (what a shell on the node would see: iptables-save, nft list ruleset,
// ip route) and returns its standard output; the error carries its
// standard error.
func (n *Node) Exec(ctx context.Context, name string, args ...string) ([]byte, error) {
	argv := append(n.enter(), name)
	argv = append(argv, args...)
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.Bytes(), &nsexec.Error{Cmd: strings.Join(append([]string{name}, args...), " "), Err: err, Stderr: strings.TrimSpace(stderr.String())}
	}
	return stdout.Bytes(), nil
}

// ImportImage imports an OCI image archive into the node's containerd
// (namespace k8s.io, the CRI's), where the kubelet finds it.
func (n *Node) ImportImage(ctx context.Context, archive string) error {
	cmd := exec.CommandContext(ctx, filepath.Join(n.c.BinDir, "ctr"), "--address", n.cfg.containerdSocket(),
		"--namespace", "k8s.io", "images", "import", archive)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s: ctr images import %s: %w: %s", n.Name, archive, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// Processes lists the node's processes the harness started.
func (n *Node) Processes() []*controlplane.Process {
	var ps []*controlplane.Process
	for _, p := range []*controlplane.Process{n.Holder, n.Containerd, n.Kubelet} {
		if p != nil {
			ps = append(ps, p)
		}
	}
	return ps
}

// start brings the node up: files, cgroup, namespaces, mounts, containerd,
// images, kubelet; then waits for its Node to be Ready.
func (n *Node) start(ctx context.Context, images []string) error {
	begin := time.Now()
	steps := []struct {
		name string
		fn   func() error
	}{
		{"files", n.writeFiles},
		{"cgroup", func() (err error) { n.cg, err = createCgroup(n.cfg.CgroupRoot); return err }},
		{"namespaces", func() error { return n.startHolder(ctx) }},
		{"mounts", func() error { return n.mount(ctx) }},
		{"containerd", func() error { return n.startContainerd(ctx) }},
		{"images", func() error {
			for _, img := range images {
				if err := n.ImportImage(ctx, img); err != nil {
					return err
				}
			}
			return nil
		}},
		{"kubelet", n.startKubelet},
		{"Ready", func() error { return n.waitReady(ctx) }},
	}
	for _, s := range steps {
		if err := s.fn(); err != nil {
			return fmt.Errorf("%s: %s: %w", n.Name, s.name, err)
		}
	}
	n.ReadyAfter = time.Since(begin)
	return nil
}

// writeFiles creates the node's directories and configuration files, and
// its kubelet's credentials: a client certificate for system:node:<name>
// in group system:nodes, which the API server's Node authorizer and
// NodeRestriction admission confine to this node's objects.
func (n *Node) writeFiles() error {
	for _, d := range []string{"containerd", "runc", "cni/net.d", "cni/ipam", "kubelet", "sysctl"} {
		if err := os.MkdirAll(filepath.Join(n.Dir, d), 0o755); err != nil {
			return err
		}
	}
	for _, d := range nodeDirs {
		if err := os.MkdirAll(filepath.Join(n.Dir, d.dir), 0o755); err != nil {
			return err
		}
	}
	files := map[string]string{
		"containerd.toml":            containerdConfig(n.cfg),
		"cni/net.d/10-pods.conflist": cniConfig(n.cfg),
		"kubelet.yaml":               kubeletConfig(n.cfg),
		"resolv.conf":                "# no cluster DNS in the real-node cluster (test/realcluster)\n",
	}
	for _, s := range kubeletSysctls {
		files[sysctlFile(s.key)] = s.value + "\n"
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(n.Dir, name), []byte(content), 0o644); err != nil {
			return err
		}
	}
	return n.c.pki.WriteClientKubeconfig(filepath.Join(n.Dir, "kubelet.kubeconfig"), n.c.cp.URL,
		"kubelet-"+n.Name, "system:node:"+n.Name, "system:nodes")
}

func sysctlFile(key string) string { return filepath.Join("sysctl", strings.ReplaceAll(key, "/", ".")) }

// startHolder starts the process holding the node's mount and PID
// namespaces: inside the node's network namespace (entered with nsenter,
// not `ip netns exec`, which would remount /sys and hide the host's
// cgroup hierarchies), unshare creates a mount namespace (slave of the
// host's) and a PID namespace whose init is pause, with /proc mounted for
// it; --kill-child kills pause, hence the whole node, if unshare dies.
func (n *Node) startHolder(ctx context.Context) error {
	n.Holder = n.c.newProcess("holder "+n.Name, n.Name+"-holder", n.NS, "unshare",
		"--mount", "--propagation=slave", "--pid", "--fork", "--mount-proc", "--kill-child=SIGKILL", n.c.pauseBin)
	n.Holder.Enter = []string{"nsenter", "--net=/run/netns/" + n.NS.Name, "--"}
	if err := n.Holder.Start(); err != nil {
		return err
	}
	unshare := n.Holder.Pid()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return controlplane.WaitFor(ctx, "the node's init (pause)", 10*time.Millisecond, []*controlplane.Process{n.Holder}, func(context.Context) error {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", unshare, unshare))
		if err != nil {
			return err
		}
		kids := strings.Fields(string(b))
		if len(kids) != 1 {
			return fmt.Errorf("unshare has children %v", kids)
		}
		pid, err := strconv.Atoi(kids[0])
		if err != nil {
			return err
		}
		// Ready once pause runs (after unshare's child mounted /proc).
		if exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid)); err != nil || exe != n.c.pauseBin {
			return fmt.Errorf("pid %d runs %q, not yet pause", pid, exe)
		}
		if n.pidNS, err = os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", pid)); err != nil {
			return err
		}
		n.init = pid
		return nil
	})
}

// mount bind-mounts the node's directories over the host's (nodeDirs) and
// the files holding the kubelet's sysctls over /proc/sys, inside the
// node's mount namespace.
func (n *Node) mount(ctx context.Context) error {
	type bind struct{ src, dst string }
	var binds []bind
	for _, d := range nodeDirs {
		binds = append(binds, bind{filepath.Join(n.Dir, d.dir), d.target})
	}
	for _, s := range kubeletSysctls {
		binds = append(binds, bind{filepath.Join(n.Dir, sysctlFile(s.key)), "/proc/sys/" + s.key})
	}
	for _, b := range binds {
		if _, err := n.Exec(ctx, "mount", "--bind", b.src, b.dst); err != nil {
			return err
		}
	}
	return nil
}

// inCgroup returns the command line prefix that runs a program in the
// node's namespaces and its runtime cgroup.
func (n *Node) inCgroup() []string { return append(n.enter(), n.cg.exec()...) }

// startContainerd starts the node's containerd and waits for its API.
func (n *Node) startContainerd(ctx context.Context) error {
	n.Containerd = n.c.newProcess("containerd "+n.Name, n.Name+"-containerd", n.NS,
		filepath.Join(n.c.BinDir, "containerd"), "--config", filepath.Join(n.Dir, "containerd.toml"))
	n.Containerd.Enter = n.inCgroup()
	if err := n.Containerd.Start(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	return controlplane.WaitFor(ctx, "containerd's API", 100*time.Millisecond, n.Processes(), func(ctx context.Context) error {
		out, err := exec.CommandContext(ctx, filepath.Join(n.c.BinDir, "ctr"), "--address", n.cfg.containerdSocket(), "version").CombinedOutput()
		if err != nil {
			return fmt.Errorf("%w: %s", err, strings.TrimSpace(string(out)))
		}
		return nil
	})
}

// startKubelet starts the node's kubelet; it registers its Node itself.
func (n *Node) startKubelet() error {
	n.Kubelet = n.c.newProcess("kubelet "+n.Name, n.Name+"-kubelet", n.NS, filepath.Join(n.c.BinDir, "kubelet"),
		"--config="+filepath.Join(n.Dir, "kubelet.yaml"),
		"--kubeconfig="+filepath.Join(n.Dir, "kubelet.kubeconfig"),
		"--root-dir="+filepath.Join(n.Dir, "kubelet"),
		"--hostname-override="+n.Name,
		"--node-ip="+n.IP.String(),
		"--v=1",
	)
	n.Kubelet.Enter = n.inCgroup()
	return n.Kubelet.Start()
}

// waitReady waits for the node's Node to be Ready.
func (n *Node) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, readyBudget)
	defer cancel()
	return controlplane.WaitFor(ctx, "Node "+n.Name+" Ready", 100*time.Millisecond, n.Processes(), func(ctx context.Context) error {
		node, err := n.c.Kube.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, cond := range node.Status.Conditions {
			if cond.Type == corev1.NodeReady {
				if cond.Status == corev1.ConditionTrue {
					return nil
				}
				return fmt.Errorf("Ready %s: %s", cond.Status, cond.Message)
			}
		}
		return errors.New("no Ready condition yet")
	})
}

// stop kills the node: SIGKILL to its init ends every process in its PID
// namespace at once (kubelet, containerd, shims, containers), which takes
// its mount namespace, and with it every mount made inside, along. Then
// the processes the harness started are reaped, anything left in the
// node's cgroup is killed and the cgroup removed.
func (n *Node) stop() error {
	var errs []error
	if n.init > 0 {
		if err := killPid(n.init); err != nil {
			errs = append(errs, fmt.Errorf("%s: kill init %d: %w", n.Name, n.init, err))
		}
	}
	for _, p := range []*controlplane.Process{n.Kubelet, n.Containerd, n.Holder} {
		if p != nil {
			if err := p.Kill(); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if n.cg != nil {
		if err := n.cg.remove(10 * time.Second); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// killPid sends SIGKILL to pid and waits up to 10 seconds for it to be
// gone (reaped by its parent).
func killPid(pid int) error {
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		if errors.Is(err, syscall.ESRCH) {
			return nil
		}
		return err
	}
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			return nil
		}
	}
	return fmt.Errorf("pid %d survives SIGKILL", pid)
}
