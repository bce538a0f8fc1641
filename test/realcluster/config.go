package realcluster

import (
	"fmt"
	"net/netip"
	"strings"
)

// The configuration files of a node, rendered by pure functions from a
// nodeConfig so that tests can read them.

// nodeConfig is what a node's configuration files depend on.
type nodeConfig struct {
	// Name is the node's name; IP its fabric address (InternalIP).
	Name string
	IP   netip.Addr
	// PodCIDR is the node's pod range (the bridge CNI's host-local IPAM).
	PodCIDR netip.Prefix
	// Dir is the node's directory; the files below live under it.
	Dir string
	// CgroupRoot is the node's cgroup (the kubelet's cgroupRoot).
	CgroupRoot string
	// ClientCAFile is the CA the kubelet checks client certificates with.
	ClientCAFile string
	// PauseImage is the sandbox image containerd runs for every pod.
	PauseImage string
	// Runc is the runc binary (Debian's).
	Runc string
}

func (n nodeConfig) path(parts ...string) string {
	return strings.Join(append([]string{n.Dir}, parts...), "/")
}

// containerdSocket is where the node's containerd serves its API (CRI and
// containerd's own, for ctr).
func (n nodeConfig) containerdSocket() string { return n.path("containerd", "containerd.sock") }

// cniConfDir holds the node's CNI network configuration.
func (n nodeConfig) cniConfDir() string { return n.path("cni", "net.d") }

// containerdConfig is the node's containerd configuration. Everything
// containerd keeps lives under the node's directory (root, state, socket,
// runc's root, the pods' network namespaces), so several containerds share
// the machine without sharing a file:
//   - restrict_oom_score_adj: root here lacks CAP_SYS_RESOURCE and cannot
//     lower a process's oom_score_adj; unrestricted, runc fails with "can't
//     get final child's PID from pipe: EOF".
//   - netns_mounts_under_state_dir: pod network namespaces are bind-mounted
//     in the node's state directory, not in the host's /run/netns.
//   - the sandbox image is the local pause image, pinned (never collected).
//   - plugins that would create host directories (/opt/containerd) or
//     sockets (/var/run/nri) are off; nothing here needs them.
func containerdConfig(n nodeConfig) string {
	return fmt.Sprintf(`# containerd of %[1]s (test/realcluster): everything under %[2]s.
version = 3
root = %[3]q
state = %[4]q
disabled_plugins = ["io.containerd.internal.v1.opt", "io.containerd.nri.v1.nri", "io.containerd.image-verifier.v1.bindir"]

[grpc]
  address = %[5]q

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = %[6]q

[plugins.'io.containerd.cri.v1.runtime']
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  disable_apparmor = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
    BinaryName = %[10]q
    Root = %[7]q
    SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = [%[8]q]
    conf_dir = %[9]q
`, n.Name, n.Dir, n.path("containerd", "root"), n.path("containerd", "state"), n.containerdSocket(),
		n.PauseImage, n.path("runc"), cniBinDir, n.cniConfDir(), n.Runc)
}

// cniBinDir is where Debian's containernetworking-plugins installs the
// plugins (bridge, host-local, loopback).
const cniBinDir = "/usr/lib/cni"

// cniConfig is the node's pod network: a bridge (cni0) holding the first
// address of the node's pod range as the pods' gateway, host-local
// addresses from the range (state kept in the node's directory), hairpin
// on so a pod reaches itself through a Service. No masquerading: the
// nodes and the control plane route every pod range, so pods keep their
// addresses across nodes as in a routed cluster network.
func cniConfig(n nodeConfig) string {
	return fmt.Sprintf(`{
  "cniVersion": "1.0.0",
  "name": "pods",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "cni0",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": %q,
        "ranges": [[{"subnet": %q}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    }
  ]
}
`, n.path("cni", "ipam"), n.PodCIDR.String())
}

// kubeletConfig is the node's KubeletConfiguration:
//   - cgroup v1 on this host: failCgroupV1 false; the cgroupfs driver; the
//     node's own cgroupRoot, so the nodes' pods do not share a kubepods
//     tree.
//   - the kubelet authenticates the API server's client certificate with
//     the cluster CA and asks the API server (webhook) what callers may do.
//   - images are imported, never pulled, and must stay: image garbage
//     collection starts only at a full disk, eviction only near one.
//   - no cluster DNS: pods get the node's empty resolv.conf.
func kubeletConfig(n nodeConfig) string {
	return fmt.Sprintf(`# kubelet of %[1]s (test/realcluster)
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: %[2]s
containerRuntimeEndpoint: unix://%[3]s
address: %[4]s
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: %[5]s
authorization:
  mode: Webhook
failSwapOn: false
resolvConf: %[6]s
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: 1Mi
  nodefs.available: 1%%
  nodefs.inodesFree: 1%%
  imagefs.available: 1%%
serializeImagePulls: false
rotateCertificates: false
`, n.Name, n.CgroupRoot, n.containerdSocket(), n.IP, n.ClientCAFile, n.path("resolv.conf"))
}

// kubeletSysctls are the host-wide sysctls the kubelet sets to these
// values at start. A node's mount namespace covers each with a file
// holding the value (bind-mounted over /proc/sys/...), so the kubelet
// reads what it wants and writes to the file, never to the host's kernel.
var kubeletSysctls = []struct{ key, value string }{
	{"vm/overcommit_memory", "1"},
	{"vm/panic_on_oom", "0"},
	{"kernel/panic", "10"},
	{"kernel/panic_on_oops", "1"},
	{"kernel/keys/root_maxkeys", "1000000"},
	{"kernel/keys/root_maxbytes", "25000000"},
}
