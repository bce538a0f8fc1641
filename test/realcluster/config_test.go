package realcluster

import (
	"encoding/json"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

func testNodeConfig(i int) nodeConfig {
	name := []string{"", "node-1", "node-2"}[i]
	return nodeConfig{
		Name: name, IP: netip.AddrFrom4([4]byte{198, 18, 0, byte(10 + i)}),
		PodCIDR: netip.PrefixFrom(netip.AddrFrom4([4]byte{198, 18, byte(64 + i), 0}), 24),
		Dir:     "/tmp/run/nodes/" + name, CgroupRoot: "/psr-1-1-" + name,
		ClientCAFile: "/tmp/run/pki/ca.crt", PauseImage: pauseImage, Runc: "/usr/sbin/runc",
	}
}

// absPaths lists the absolute paths a configuration file names (as a
// value, quoted or not, or in a unix:// URL).
func absPaths(s string) []string {
	var paths []string
	for _, m := range regexp.MustCompile(`(?:^|[\s"=:]|unix://)(/[a-z][A-Za-z0-9._/-]*)`).FindAllStringSubmatch(s, -1) {
		paths = append(paths, strings.TrimSuffix(m[1], "."))
	}
	return paths
}

// TestNodesShareNoPath renders two nodes' configuration files and checks
// that every path one node's containerd, CNI and kubelet write to is its
// own: nothing but the host's binaries and the cluster CA is shared.
func TestNodesShareNoPath(t *testing.T) {
	shared := []string{"/usr/sbin/runc", cniBinDir, "/tmp/run/pki/ca.crt"}
	paths := map[string][]string{}
	for i := 1; i <= 2; i++ {
		n := testNodeConfig(i)
		for _, f := range []string{containerdConfig(n), cniConfig(n), kubeletConfig(n)} {
			for _, p := range absPaths(f) {
				if slices.Contains(shared, p) || p == n.CgroupRoot || p == n.Dir {
					continue
				}
				if !strings.HasPrefix(p, n.Dir+"/") {
					t.Errorf("%s's configuration names %s, outside its directory %s", n.Name, p, n.Dir)
				}
				paths[n.Name] = append(paths[n.Name], p)
			}
		}
	}
	if len(paths["node-1"]) < 8 {
		t.Fatalf("found only %v in node-1's files", paths["node-1"])
	}
	for _, p := range paths["node-1"] {
		if slices.Contains(paths["node-2"], p) {
			t.Errorf("both nodes use %s", p)
		}
	}
}

// TestKubeletConfig checks the settings this host needs (cgroup v1, the
// node's own cgroup root and runtime, no image collection) in the parsed
// KubeletConfiguration.
func TestKubeletConfig(t *testing.T) {
	n := testNodeConfig(1)
	var cfg map[string]any
	if err := yaml.Unmarshal([]byte(kubeletConfig(n)), &cfg); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{
		"kind":                        "KubeletConfiguration",
		"failCgroupV1":                false,
		"cgroupDriver":                "cgroupfs",
		"cgroupRoot":                  n.CgroupRoot,
		"containerRuntimeEndpoint":    "unix://" + n.containerdSocket(),
		"address":                     n.IP.String(),
		"imageGCHighThresholdPercent": float64(100),
	}
	for k, v := range want {
		if cfg[k] != v {
			t.Errorf("%s = %v, want %v", k, cfg[k], v)
		}
	}
}

// TestCNIConfig checks the bridge network hands out the node's pod range,
// keeps its state in the node's directory and does not masquerade.
func TestCNIConfig(t *testing.T) {
	n := testNodeConfig(2)
	var cfg struct {
		CNIVersion string `json:"cniVersion"`
		Plugins    []struct {
			Type   string `json:"type"`
			IPMasq bool   `json:"ipMasq"`
			IPAM   struct {
				Type    string `json:"type"`
				DataDir string `json:"dataDir"`
				Ranges  [][]struct {
					Subnet string `json:"subnet"`
				} `json:"ranges"`
			} `json:"ipam"`
		} `json:"plugins"`
	}
	if err := json.Unmarshal([]byte(cniConfig(n)), &cfg); err != nil {
		t.Fatal(err)
	}
	if len(cfg.Plugins) != 1 || cfg.Plugins[0].Type != "bridge" || cfg.Plugins[0].IPMasq {
		t.Fatalf("plugins %+v, want one bridge without masquerading", cfg.Plugins)
	}
	ipam := cfg.Plugins[0].IPAM
	if ipam.Type != "host-local" || !strings.HasPrefix(ipam.DataDir, n.Dir+"/") ||
		len(ipam.Ranges) != 1 || len(ipam.Ranges[0]) != 1 || ipam.Ranges[0][0].Subnet != "198.18.66.0/24" {
		t.Errorf("ipam %+v, want host-local in %s from 198.18.66.0/24", ipam, n.Dir)
	}
}
