package dataplane

import (
	"fmt"
	"os"
	"strings"
)

// Sysctls of the node's network namespace, for the backends that set
// some (ipvs: its connection handling; iptables: route_localnet for
// localhost NodePorts). Both read and write them the same way, under a
// directory the agent can point at the host's /proc/sys/net mounted
// read-write (an unprivileged agent's case): the code lives here once.
// The functions work on the calling thread's network namespace (files
// under /proc/sys/net are the namespace's of the thread that opens
// them); callers run them in the node's (nsexec.NS.Do).

// SysctlPath is where sysctl name (net.ipv4.vs.conntrack) is under
// procSys; "" is /proc/sys.
func SysctlPath(procSys, name string) string {
	if procSys == "" {
		procSys = "/proc/sys"
	}
	return strings.TrimSuffix(procSys, "/") + "/" + strings.ReplaceAll(name, ".", "/")
}

// SetSysctls writes the Want of every setting whose value under procSys
// differs from it, and stops at the first that cannot be written. The
// error names the setting; mode prefixes it ("ipvs").
func SetSysctls(mode, procSys string, settings []KernelSetting) error {
	for _, s := range settings {
		got, err := os.ReadFile(SysctlPath(procSys, s.Name))
		if err == nil && strings.TrimSpace(string(got)) == s.Want {
			continue
		}
		if err := os.WriteFile(SysctlPath(procSys, s.Name), []byte(s.Want), 0o644); err != nil {
			return fmt.Errorf("%s: set %s=%s: %w", mode, s.Name, s.Want, err)
		}
	}
	return nil
}

// ReadSysctls fills in the Value of each setting from procSys; a setting
// that cannot be read keeps an empty Value.
func ReadSysctls(procSys string, settings []KernelSetting) {
	for i, s := range settings {
		if got, err := os.ReadFile(SysctlPath(procSys, s.Name)); err == nil {
			settings[i].Value = strings.TrimSpace(string(got))
		}
	}
}
