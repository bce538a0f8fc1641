// Package kubeproxyconfig reads and changes the mode in kube-proxy's
// configuration file, as kubeadm and most distributions keep it: a
// KubeProxyConfiguration in a ConfigMap (kube-system/kube-proxy, key
// config.conf) that every kube-proxy pod reads when it starts.
//
// proxyshift changes one thing in it, the top-level mode line, and edits
// the text rather than re-encoding the document, so comments, field order
// and every setting it does not know stay as they were. Before its first
// change it keeps the whole previous text in an annotation on the
// ConfigMap, and the digest of the text it wrote in another. Setting the
// previous mode again restores the previous text byte for byte, unless a
// person changed the file since (the digest no longer matches): then only
// the mode line is put back and their change stays. It is pure; the
// operator's reconciler reads and writes the ConfigMap.
package kubeproxyconfig

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"regexp"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
)

// Annotations proxyshift keeps on kube-proxy's ConfigMap while its mode is
// changed.
const (
	// AnnotationPrevious holds the configuration file as it was before
	// proxyshift first changed its mode.
	AnnotationPrevious = "network.proxyshift.io/previous-config"
	// AnnotationWritten is the SHA-256 (hex) of the file proxyshift last
	// wrote: a different file means a person changed it since.
	AnnotationWritten = "network.proxyshift.io/written-config-sha256"
)

// Config is what proxyshift reads of kube-proxy's configuration.
type Config struct {
	// Mode is kube-proxy's mode; the empty mode of the file is read as
	// iptables, kube-proxy's default on Linux.
	Mode v1alpha1.ProxyMode
	// ClusterCIDRs are the pod networks (clusterCIDR, comma-separated in
	// the file).
	ClusterCIDRs []v1alpha1.CIDR
	// NodePortAddresses are the node addresses NodePorts answer on, as
	// kube-proxy in Mode applies the file (see nodePortAddressesIn).
	NodePortAddresses []v1alpha1.NodePortAddress
	// written is nodePortAddresses as the file says it, for InMode.
	written []v1alpha1.NodePortAddress
}

// InMode is the configuration as kube-proxy would apply the same file in
// mode. A change of kube-proxy's mode rewrites only the mode line, so
// this is what kube-proxy did before the change (or does after it),
// whichever mode the file says meanwhile.
func (c Config) InMode(mode v1alpha1.ProxyMode) Config {
	c.Mode = mode
	c.NodePortAddresses = nodePortAddressesIn(mode, c.written)
	return c
}

// kube-proxy's nodePortAddresses keywords (v1.37 expands them in
// cmd/kube-proxy/app/server.go, expandNodePortAddressKeywords): the
// node's primary addresses, 127.0.0.0/8 and ::1, and every address.
const (
	keywordPrimary   = "primary"
	keywordLocalhost = "localhost"
	keywordAll       = "all"
)

// nodePortAddressesIn is the nodePortAddresses kube-proxy applies in mode
// when the file says written, in proxyshift's terms. kube-proxy's
// nftables mode reads an unset list as primary (the node's primary
// addresses; v1.37 cmd/kube-proxy/app/server_linux.go
// platformApplyDefaults), its other modes as every local address, which
// is what an empty list means to proxyshift too; so does a list with the
// keyword all, whatever else it holds.
func nodePortAddressesIn(mode v1alpha1.ProxyMode, written []v1alpha1.NodePortAddress) []v1alpha1.NodePortAddress {
	switch {
	case slices.Contains(written, keywordAll):
		return nil
	case mode == v1alpha1.ModeNFTables && len(written) == 0:
		return []v1alpha1.NodePortAddress{v1alpha1.NodePortAddressPrimary}
	}
	return written
}

// CheckSettings says why proxyshift's settings cannot say the file's
// clusterCIDR and nodePortAddresses as kube-proxy applies them (nil when
// they can). They take CIDRs, and for nodePortAddresses primary alone;
// kube-proxy also takes CIDRs written loosely (leading zeros), the
// keyword localhost, and primary beside CIDRs. A change of kube-proxy's
// mode runs proxyshift with kube-proxy's settings meanwhile, so it needs
// them said exactly.
func (c Config) CheckSettings() error {
	for _, cidr := range c.ClusterCIDRs {
		if _, err := cidr.Parse(); err != nil {
			return fmt.Errorf("in its clusterCIDR, %v", err)
		}
	}
	if slices.Contains(c.written, keywordAll) {
		return nil
	}
	for _, a := range c.written {
		switch a {
		case keywordLocalhost:
			return fmt.Errorf("its nodePortAddresses %v has the keyword localhost (NodePorts on 127.0.0.1 and ::1), which proxyshift's settings cannot say (they take CIDRs, or primary alone)", c.written)
		case keywordPrimary:
			if len(c.written) > 1 {
				return fmt.Errorf("its nodePortAddresses %v has the keyword primary beside CIDRs, which proxyshift's settings cannot say (they take primary alone, or CIDRs: write the nodes' addresses as CIDRs)", c.written)
			}
		default:
			if _, err := v1alpha1.CIDR(a).Parse(); err != nil {
				return fmt.Errorf("in its nodePortAddresses, %v", err)
			}
		}
	}
	return nil
}

// file is the part of a KubeProxyConfiguration proxyshift reads.
type file struct {
	Kind              string   `json:"kind"`
	Mode              string   `json:"mode"`
	ClusterCIDR       string   `json:"clusterCIDR"`
	NodePortAddresses []string `json:"nodePortAddresses"`
}

// Parse reads a kube-proxy configuration file.
func Parse(text string) (Config, error) {
	var f file
	if err := yaml.Unmarshal([]byte(text), &f); err != nil {
		return Config{}, fmt.Errorf("not a KubeProxyConfiguration: %v", err)
	}
	if f.Kind != "KubeProxyConfiguration" {
		return Config{}, fmt.Errorf("kind is %q, not KubeProxyConfiguration", f.Kind)
	}
	var c Config
	switch f.Mode {
	case "", "iptables":
		c.Mode = v1alpha1.ModeIPTables
	case "nftables", "ipvs":
		c.Mode = v1alpha1.ProxyMode(f.Mode)
	default:
		return Config{}, fmt.Errorf("mode %q is not one proxyshift can bridge (iptables, nftables, ipvs)", f.Mode)
	}
	for _, cidr := range strings.Split(f.ClusterCIDR, ",") {
		if cidr = strings.TrimSpace(cidr); cidr != "" {
			c.ClusterCIDRs = append(c.ClusterCIDRs, v1alpha1.CIDR(cidr))
		}
	}
	for _, a := range f.NodePortAddresses {
		c.written = append(c.written, v1alpha1.NodePortAddress(a))
	}
	return c.InMode(c.Mode), nil
}

// modeLine is the top-level mode field of a YAML document.
var modeLine = regexp.MustCompile(`(?m)^mode:[^\n]*$`)

// SetMode returns the file with its top-level mode set to mode: the mode
// line replaced, or one appended when there is none.
func SetMode(text string, mode v1alpha1.ProxyMode) (string, error) {
	line := "mode: " + string(mode)
	var out string
	switch n := len(modeLine.FindAllStringIndex(text, -1)); n {
	case 0:
		if strings.HasPrefix(strings.TrimSpace(text), "{") {
			return "", fmt.Errorf("the file is JSON on one line; proxyshift edits only YAML files with a top-level mode line")
		}
		out = strings.TrimRight(text, "\n") + "\n" + line + "\n"
	case 1:
		out = modeLine.ReplaceAllLiteralString(text, line)
	default:
		return "", fmt.Errorf("the file has %d top-level mode lines", n)
	}
	c, err := Parse(out)
	if err != nil {
		return "", fmt.Errorf("setting mode %s: %v", mode, err)
	}
	if c.Mode != mode {
		return "", fmt.Errorf("setting mode %s: the file still reads as mode %s", mode, c.Mode)
	}
	return out, nil
}

// Read parses the file under key in cm.
func Read(cm *corev1.ConfigMap, key string) (Config, error) {
	text, ok := cm.Data[key]
	if !ok {
		return Config{}, fmt.Errorf("ConfigMap %s/%s has no key %q", cm.Namespace, cm.Name, key)
	}
	c, err := Parse(text)
	if err != nil {
		return Config{}, fmt.Errorf("ConfigMap %s/%s key %s: %v", cm.Namespace, cm.Name, key, err)
	}
	return c, nil
}

// PreviousMode is kube-proxy's mode before proxyshift first changed it:
// from AnnotationPrevious, or ok false when proxyshift has not changed it
// (or the annotation does not parse).
func PreviousMode(cm *corev1.ConfigMap) (v1alpha1.ProxyMode, bool) {
	prev, ok := cm.Annotations[AnnotationPrevious]
	if !ok {
		return "", false
	}
	c, err := Parse(prev)
	if err != nil {
		return "", false
	}
	return c.Mode, true
}

// WithMode returns a copy of cm whose file under key says mode, with the
// annotations that make the change undoable; nil when the file says mode
// already and nothing is left to undo. Going back to the mode the file
// had before proxyshift changed it restores that file (see the package
// doc) and removes the annotations.
func WithMode(cm *corev1.ConfigMap, key string, mode v1alpha1.ProxyMode) (*corev1.ConfigMap, error) {
	cur, err := Read(cm, key)
	if err != nil {
		return nil, err
	}
	text := cm.Data[key]
	prevMode, changed := PreviousMode(cm)
	out := cm.DeepCopy()
	switch {
	case changed && prevMode == mode:
		if cm.Annotations[AnnotationWritten] == digest(text) {
			out.Data[key] = cm.Annotations[AnnotationPrevious]
		} else if cur.Mode != mode {
			if out.Data[key], err = SetMode(text, mode); err != nil {
				return nil, err
			}
		}
		delete(out.Annotations, AnnotationPrevious)
		delete(out.Annotations, AnnotationWritten)
		return out, nil
	case cur.Mode == mode:
		return nil, nil
	}
	if out.Data[key], err = SetMode(text, mode); err != nil {
		return nil, err
	}
	if out.Annotations == nil {
		out.Annotations = map[string]string{}
	}
	if !changed {
		out.Annotations[AnnotationPrevious] = text
	}
	out.Annotations[AnnotationWritten] = digest(out.Data[key])
	return out, nil
}

func digest(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}
