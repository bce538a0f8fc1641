package ipvs

import (
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/proxyshift/proxyshift/nodeagent/dataplane"
)

// Setting is one kernel setting of the node's network namespace that the
// backend sets, and what the kernel holds for it.
type Setting struct {
	// Name is the sysctl's name, e.g. net.ipv4.vs.conntrack.
	Name string
	// Want is the value the backend sets.
	Want string
	// Value is the value the kernel holds; "" if it could not be read.
	Value string
	// Why says what the backend needs it for.
	Why string
}

// settings returns the sysctls the backend sets on a kernel of the given
// release.
func (b *Backend) settings(release string) []Setting {
	reuse := Setting{Name: "net.ipv4.vs.conn_reuse_mode", Want: "1",
		Why: "a new connection reusing the source port of an old one is scheduled afresh, not sent to the old (maybe removed or draining) real server"}
	if kernelBefore(release, 5, 9) {
		reuse.Want = "0"
		reuse.Why = "before Linux 5.9, mode 1 with conntrack stalls such connections for a second"
	}
	s := []Setting{
		{Name: "net.ipv4.vs.conntrack", Want: "1",
			Why: "IPVS connections keep conntrack entries, which masquerading and the helper table's ct state matches need"},
		{Name: "net.ipv4.vs.expire_nodest_conn", Want: "1",
			Why: "connections to a deleted real server end at their next packet instead of hanging"},
		{Name: "net.ipv4.vs.expire_quiescent_template", Want: "1",
			Why: "session-affinity templates of a draining (weight 0) real server expire, so clients move on"},
		reuse,
	}
	if b.strictARP {
		s = append(s,
			Setting{Name: "net.ipv4.conf.all.arp_ignore", Want: "1",
				Why: "strictARP: answer ARP only for addresses of the interface asked, not for service IPs on the dummy interface"},
			Setting{Name: "net.ipv4.conf.all.arp_announce", Want: "2",
				Why: "strictARP: never announce a service IP as the source of ARP requests"})
	}
	return s
}

// kernelBefore says whether a kernel release ("6.1.0-57-cloud-amd64")
// is older than major.minor; an unreadable release is not.
func kernelBefore(release string, major, minor int) bool {
	parts := strings.SplitN(release, ".", 3)
	if len(parts) < 2 {
		return false
	}
	gotMajor, err1 := strconv.Atoi(parts[0])
	gotMinor, err2 := strconv.Atoi(strings.TrimRightFunc(parts[1], func(r rune) bool { return r < '0' || r > '9' }))
	if err1 != nil || err2 != nil {
		return false
	}
	return gotMajor < major || gotMajor == major && gotMinor < minor
}

func kernelRelease() string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return ""
	}
	return unix.ByteSliceToString(u.Release[:])
}

// setSysctls writes every setting that differs from what it wants, in the
// backend's network namespace.
func (b *Backend) setSysctls() error {
	return b.inNetNS(func() error {
		return dataplane.SetSysctls("ipvs", b.procSys, kernelSettings(b.settings(kernelRelease())))
	})
}

var _ dataplane.SettingsReporter = (*Backend)(nil)

// KernelSettings reads back the sysctls the backend sets, for the node's
// status (dataplane.SettingsReporter). A setting that cannot be read
// (IPVS not loaded yet) has an empty Value.
func (b *Backend) KernelSettings() ([]dataplane.KernelSetting, error) {
	settings := kernelSettings(b.settings(kernelRelease()))
	err := b.inNetNS(func() error {
		dataplane.ReadSysctls(b.procSys, settings)
		return nil
	})
	return settings, err
}

// kernelSettings converts settings for the node's status, in their order;
// Why stays out (it is the same on every node).
func kernelSettings(settings []Setting) []dataplane.KernelSetting {
	if len(settings) == 0 {
		return nil
	}
	out := make([]dataplane.KernelSetting, 0, len(settings))
	for _, s := range settings {
		out = append(out, dataplane.KernelSetting{Name: s.Name, Want: s.Want, Value: s.Value})
	}
	return out
}

// inNetNS runs fn on a thread in the backend's network namespace: sysctls
// under /proc/sys/net are those of the namespace of the thread that opens
// them. The thread is thrown away afterwards if it cannot return to its
// own namespace.
func (b *Backend) inNetNS(fn func() error) error {
	return b.netns.Do(fn)
}
