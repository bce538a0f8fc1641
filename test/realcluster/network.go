package realcluster

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/proxyshift/proxyshift/nodeagent/nsexec"
	"github.com/proxyshift/proxyshift/test/cluster"
	"github.com/proxyshift/proxyshift/test/controlplane"
	"github.com/proxyshift/proxyshift/test/netlab"
)

// The address plan is the namespace lab's (test/cluster): fabric
// 198.18.0.0/24 (gateway .1, control plane .2, node i at .10+i, the client
// at .101), pods 198.18.64.0/18 (node i: 198.18.(64+i).0/24, its bridge
// cni0 at .1), Services 198.19.0.0/16.
var clientIP = netip.MustParseAddr("198.18.0.101")

const fabricBridge = "br-fabric"

// buildNetwork creates the fabric, the control-plane namespace, the
// nodes' namespaces and the client, with the routes between them: every
// node and the control plane route each node's pod range via that node,
// so pods keep their addresses from node to node and reach the API server
// without masquerading.
func (c *Cluster) buildNetwork() error {
	var err error
	if c.Fabric, err = c.namespaces.Create("fabric"); err != nil {
		return err
	}
	if c.fabric, err = netlab.NewFabric(c.Fabric, fabricBridge, netip.PrefixFrom(cluster.FabricGateway, cluster.FabricCIDR.Bits())); err != nil {
		return err
	}
	if c.ControlPlane, err = c.namespaces.Create("cp"); err != nil {
		return err
	}
	if err := c.fabric.AddServer(c.ControlPlane, "cp", "eth0", cluster.APIServerIP); err != nil {
		return fmt.Errorf("control plane: %w", err)
	}
	for i := 1; i <= c.opts.Nodes; i++ {
		n, err := c.addNode(i)
		if err != nil {
			return err
		}
		c.Nodes = append(c.Nodes, n)
	}
	for _, n := range c.Nodes {
		if err := c.ControlPlane.AddRoute(n.PodCIDR, n.IP); err != nil {
			return err
		}
		for _, m := range c.Nodes {
			if m != n {
				if err := n.NS.AddRoute(m.PodCIDR, m.IP); err != nil {
					return err
				}
			}
		}
	}
	if c.Client, err = c.namespaces.Create("client"); err != nil {
		return err
	}
	c.ClientIP = clientIP
	if err := c.fabric.AddHost(c.Client, "h1", "eth0", clientIP, c.Nodes[0].IP); err != nil {
		return fmt.Errorf("client: %w", err)
	}
	return nil
}

// addNode creates node i's network namespace, a router on the fabric
// (netlab.Fabric.AddRouter), with the bridge netfilter hook on so that a
// pod's packets crossing cni0 to a Service answered on the same bridge
// pass through kube-proxy's rules (hairpin and same-node ClusterIP
// traffic).
func (c *Cluster) addNode(i int) (*Node, error) {
	name := fmt.Sprintf("node-%d", i)
	ns, err := c.namespaces.Create(name)
	if err != nil {
		return nil, err
	}
	n := &Node{
		Name: name, Index: i, IP: cluster.NodeIP(i), PodCIDR: cluster.NodePodCIDR(i), NS: ns,
		Dir: filepath.Join(c.RunDir, "nodes", name), c: c,
	}
	runc, err := nsexec.LookPath("runc")
	if err != nil {
		return nil, err
	}
	n.cfg = nodeConfig{
		Name: name, IP: n.IP, PodCIDR: n.PodCIDR, Dir: n.Dir,
		CgroupRoot:   "/" + c.namespaces.Name(name),
		ClientCAFile: c.pki.Path("ca.crt"),
		PauseImage:   pauseImage,
		Runc:         runc,
	}
	if err := c.fabric.AddRouter(ns, fmt.Sprintf("n%d", i), "eth0", n.IP); err != nil {
		return nil, fmt.Errorf("node %s: %w", name, err)
	}
	if err := ns.SetSysctl("net/bridge/bridge-nf-call-iptables", "1"); err != nil {
		return nil, fmt.Errorf("node %s: %w", name, err)
	}
	return n, nil
}

// startControlPlane starts etcd and kube-apiserver (controlplane.Start)
// with node authorization (Node,RBAC and NodeRestriction: a kubelet may
// touch only its own Node and its pods) and a client certificate for the
// kubelets' API (logs, exec), then kube-controller-manager and
// kube-scheduler, each with its own client certificate, in the
// control-plane namespace.
func (c *Cluster) startControlPlane(ctx context.Context) error {
	if _, _, err := c.pki.IssueClient("apiserver-kubelet-client", "kube-apiserver-kubelet-client", controlplane.AdminGroup); err != nil {
		return err
	}
	cp, err := controlplane.Start(ctx, controlplane.Spec{
		NS: c.ControlPlane, IP: cluster.APIServerIP, Port: cluster.APIServerPort, ServiceCIDR: cluster.ServiceCIDR,
		BinDir: c.BinDir, RunDir: c.RunDir, LogDir: c.LogDir, PKI: c.pki, Env: c.childEnv,
		ForwardAddr:   c.opts.ForwardAddr,
		Authorization: "Node,RBAC",
		APIServerArgs: []string{
			"--enable-admission-plugins=NodeRestriction",
			"--kubelet-client-certificate=" + c.pki.Path("apiserver-kubelet-client.crt"),
			"--kubelet-client-key=" + c.pki.Path("apiserver-kubelet-client.key"),
			"--kubelet-preferred-address-types=InternalIP",
		},
	})
	c.cp, c.Etcd, c.APIServer = cp, cp.Etcd, cp.APIServer
	if err != nil {
		return err
	}
	c.APIServerURL, c.Config, c.Kube = cp.URL, cp.Config, cp.Kube
	c.Kubeconfig, c.NSKubeconfig, c.ForwardAddr = cp.Kubeconfig, cp.NSKubeconfig, cp.ForwardAddr

	kcmKubeconfig := filepath.Join(c.RunDir, "kube-controller-manager.kubeconfig")
	if err := c.pki.WriteClientKubeconfig(kcmKubeconfig, cp.URL, "kube-controller-manager", "system:kube-controller-manager"); err != nil {
		return err
	}
	schedKubeconfig := filepath.Join(c.RunDir, "kube-scheduler.kubeconfig")
	if err := c.pki.WriteClientKubeconfig(schedKubeconfig, cp.URL, "kube-scheduler", "system:kube-scheduler"); err != nil {
		return err
	}
	// Every controller runs (deployment, replicaset, daemonset,
	// endpointslice, node lifecycle, service-account and its tokens,
	// the root CA publisher that gives pods kube-root-ca.crt), each with
	// its own ServiceAccount's credentials as in a kubeadm cluster.
	c.ControllerManager = cp.NewProcess("kube-controller-manager", "kube-controller-manager", filepath.Join(c.BinDir, "kube-controller-manager"),
		"--kubeconfig="+kcmKubeconfig,
		"--authentication-kubeconfig="+kcmKubeconfig,
		"--authorization-kubeconfig="+kcmKubeconfig,
		"--bind-address=127.0.0.1",
		"--controllers=*",
		"--use-service-account-credentials=true",
		"--service-account-private-key-file="+c.pki.Path("sa.key"),
		"--root-ca-file="+c.pki.Path("ca.crt"),
		"--cluster-cidr="+cluster.ClusterCIDR.String(),
		"--service-cluster-ip-range="+cluster.ServiceCIDR.String(),
		"--leader-elect=false",
		"--v=1",
	)
	c.Scheduler = cp.NewProcess("kube-scheduler", "kube-scheduler", filepath.Join(c.BinDir, "kube-scheduler"),
		"--kubeconfig="+schedKubeconfig,
		"--authentication-kubeconfig="+schedKubeconfig,
		"--authorization-kubeconfig="+schedKubeconfig,
		"--bind-address=127.0.0.1",
		"--leader-elect=false",
		"--v=1",
	)
	for _, p := range []*controlplane.Process{c.ControllerManager, c.Scheduler} {
		if err := p.Start(); err != nil {
			return err
		}
	}
	// Both serve /healthz on the control-plane namespace's loopback.
	ctx, cancel := context.WithTimeout(ctx, readyBudget)
	defer cancel()
	for _, s := range []struct {
		p    *controlplane.Process
		port int
	}{{c.ControllerManager, 10257}, {c.Scheduler, 10259}} {
		err := controlplane.WaitFor(ctx, s.p.Name+" /healthz", 100*time.Millisecond, c.Processes(), func(ctx context.Context) error {
			return healthz(ctx, c.ControlPlane, s.port)
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// healthz asks https://127.0.0.1:port/healthz inside ns for a 200 (the
// serving certificate is self-signed; /healthz needs no credentials).
func healthz(ctx context.Context, ns *netlab.NetNS, port int) error {
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	hc := &http.Client{Transport: &http.Transport{
		DialContext:       ns.DialContext,
		TLSClientConfig:   &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // a throwaway self-signed certificate
		DisableKeepAlives: true,
	}}
	req, err := http.NewRequestWithContext(rctx, http.MethodGet, "https://"+net.JoinHostPort("127.0.0.1", strconv.Itoa(port))+"/healthz", nil)
	if err != nil {
		return err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("/healthz: %s", resp.Status)
	}
	return nil
}

// startNodes brings every node up at once and waits for all to be Ready.
func (c *Cluster) startNodes(ctx context.Context) error {
	errs := make([]error, len(c.Nodes))
	var wg sync.WaitGroup
	for i, n := range c.Nodes {
		wg.Go(func() { errs[i] = n.start(ctx, c.Images) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
