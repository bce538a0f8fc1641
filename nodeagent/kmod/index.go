package kmod

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// Kernel is one kernel's modules: the modules directory that describes
// what can be loaded or is built in, and the lists of what is loaded. The
// zero value is the running kernel. Tests point the paths at fixtures.
// A Kernel keeps no state between calls: every Probe and Load reads the
// files afresh, so it is safe for concurrent use.
type Kernel struct {
	// ModulesDir holds modules.dep, modules.builtin, modules.softdep,
	// modules.alias and the module files; /lib/modules/$(uname -r) when
	// empty.
	ModulesDir string
	// ProcModules lists the loaded modules; /proc/modules when empty.
	ProcModules string
	// SysModule is sysfs's module directory; /sys/module when empty.
	SysModule string

	// insert loads one module file into the kernel; nil is the real
	// finit_module/init_module. Unit tests record calls instead.
	insert func(path string) error
}

// renamed maps module names that current kernels no longer have to the
// module that took their place.
var renamed = map[string]string{
	// Linux 4.19 merged the per-family conntrack modules into nf_conntrack.
	"nf_conntrack_ipv4": "nf_conntrack",
	"nf_conntrack_ipv6": "nf_conntrack",
	// Linux 5.1 merged the per-family NAT modules into nf_nat and the
	// per-family nftables NAT chain types into nft_chain_nat.
	"nf_nat_ipv4":        "nf_nat",
	"nf_nat_ipv6":        "nf_nat",
	"nft_chain_nat_ipv4": "nft_chain_nat",
	"nft_chain_nat_ipv6": "nft_chain_nat",
}

// canonical is a module name as the kernel spells it: dashes are
// underscores, and a file name ("kernel/net/x-y.ko.zst") is its module.
func canonical(name string) string {
	base := filepath.Base(name)
	if i := strings.Index(base, ".ko"); i > 0 && (len(base) == i+3 || base[i+3] == '.') {
		base = base[:i]
	}
	return strings.ReplaceAll(base, "-", "_")
}

// index is what the files said at one moment. A source that could not be
// read keeps its error, so that a state depending on it is Unknown.
type index struct {
	dir string

	dep    map[string]depEntry
	depErr error

	builtin    map[string]bool
	builtinErr error

	// loaded maps loaded modules to their /proc/modules state (Live,
	// Loading, Unloading).
	loaded   map[string]string
	procErr  error
	procPath string

	sysModule string

	// softdep and alias are read only when loading.
	softdep map[string]softdeps
	alias   map[string][]string
}

// depEntry is one line of modules.dep.
type depEntry struct {
	// path is the module's file, absolute or relative to the modules
	// directory as modules.dep has it.
	path string
	// deps are the module's dependencies (all of them, not only direct
	// ones), in modules.dep's order.
	deps []string
}

// softdeps are a module's soft dependencies from modules.softdep.
type softdeps struct {
	pre, post []string
}

func (k *Kernel) modulesDir() (string, error) {
	if k.ModulesDir != "" {
		return k.ModulesDir, nil
	}
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return "", fmt.Errorf("uname: %w", err)
	}
	return filepath.Join("/lib/modules", unix.ByteSliceToString(u.Release[:])), nil
}

func orDefault(path, def string) string {
	if path != "" {
		return path
	}
	return def
}

// read takes a fresh index of the kernel's modules.
func (k *Kernel) read() *index {
	ix := &index{
		procPath:  orDefault(k.ProcModules, "/proc/modules"),
		sysModule: orDefault(k.SysModule, "/sys/module"),
	}
	ix.loaded, ix.procErr = readProcModules(ix.procPath)
	dir, err := k.modulesDir()
	if err != nil {
		ix.depErr, ix.builtinErr = err, err
		return ix
	}
	ix.dir = dir
	ix.dep, ix.depErr = readModulesDep(filepath.Join(dir, "modules.dep"))
	ix.builtin, ix.builtinErr = readModulesBuiltin(filepath.Join(dir, "modules.builtin"))
	return ix
}

// readLines calls fn for each line of the file that is not empty or a
// comment.
func readLines(path string, fn func(line string)) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line != "" && !strings.HasPrefix(line, "#") {
			fn(line)
		}
	}
	return sc.Err()
}

// readProcModules reads /proc/modules: "name size refcount deps state
// address" per line.
func readProcModules(path string) (map[string]string, error) {
	loaded := map[string]string{}
	err := readLines(path, func(line string) {
		f := strings.Fields(line)
		if len(f) >= 5 {
			loaded[canonical(f[0])] = f[4]
		}
	})
	return loaded, err
}

// readModulesDep reads modules.dep: "path: dep-path dep-path ..." per line.
func readModulesDep(path string) (map[string]depEntry, error) {
	dep := map[string]depEntry{}
	err := readLines(path, func(line string) {
		file, deps, ok := strings.Cut(line, ":")
		if !ok {
			return
		}
		e := depEntry{path: strings.TrimSpace(file)}
		for _, d := range strings.Fields(deps) {
			e.deps = append(e.deps, canonical(d))
		}
		dep[canonical(e.path)] = e
	})
	return dep, err
}

// readModulesBuiltin reads modules.builtin: one module path per line.
func readModulesBuiltin(path string) (map[string]bool, error) {
	builtin := map[string]bool{}
	err := readLines(path, func(line string) { builtin[canonical(line)] = true })
	return builtin, err
}

// readSoftdeps reads modules.softdep: "softdep MOD pre: A B post: C" per
// line. The file is optional: a kernel without soft dependencies may not
// have one.
func readSoftdeps(path string) map[string]softdeps {
	soft := map[string]softdeps{}
	_ = readLines(path, func(line string) {
		f := strings.Fields(line)
		if len(f) < 3 || f[0] != "softdep" {
			return
		}
		mod := canonical(f[1])
		s := soft[mod]
		var list *[]string
		for _, w := range f[2:] {
			switch w {
			case "pre:":
				list = &s.pre
			case "post:":
				list = &s.post
			default:
				if list != nil {
					*list = append(*list, w)
				}
			}
		}
		soft[mod] = s
	})
	return soft
}

// readAliases reads the exact aliases of modules.alias ("alias NAME
// MODULE"); wildcard aliases are for devices and are skipped. The file is
// optional.
func readAliases(path string) map[string][]string {
	alias := map[string][]string{}
	_ = readLines(path, func(line string) {
		f := strings.Fields(line)
		if len(f) != 3 || f[0] != "alias" || strings.ContainsAny(f[1], "*?[") {
			return
		}
		a := canonical(f[1])
		alias[a] = append(alias[a], canonical(f[2]))
	})
	return alias
}

// loadedState says whether the module is in the kernel as a loadable
// module: from /proc/modules, or from /sys/module/NAME/initstate when
// /proc/modules cannot be read. known is false when neither can tell.
func (ix *index) loadedState(name string) (state string, known bool, reason string) {
	if ix.procErr == nil {
		if s, ok := ix.loaded[name]; ok {
			return s, true, fmt.Sprintf("%s in %s", s, ix.procPath)
		}
		return "", true, ""
	}
	if _, err := os.Stat(ix.sysModule); err != nil {
		return "", false, fmt.Sprintf("cannot read %s: %v, nor %s", ix.procPath, ix.procErr, ix.sysModule)
	}
	data, err := os.ReadFile(filepath.Join(ix.sysModule, name, "initstate"))
	switch {
	case err == nil:
		// initstate says live, coming or going: the names /proc/modules
		// gives as Live, Loading and Unloading.
		s := map[string]string{"live": "Live", "coming": "Loading", "going": "Unloading"}[strings.TrimSpace(string(data))]
		if s == "" {
			s = strings.TrimSpace(string(data))
		}
		return s, true, fmt.Sprintf("%s in %s", s, filepath.Join(ix.sysModule, name, "initstate"))
	case errors.Is(err, fs.ErrNotExist):
		return "", true, ""
	default:
		return "", false, fmt.Sprintf("cannot read %s: %v, nor %v", ix.procPath, ix.procErr, err)
	}
}

// sysBuiltin says whether /sys/module/NAME exists without an initstate
// file, which only a built-in module's directory lacks.
func (ix *index) sysBuiltin(name string) bool {
	dir := filepath.Join(ix.sysModule, name)
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		return false
	}
	_, err := os.Stat(filepath.Join(dir, "initstate"))
	return errors.Is(err, fs.ErrNotExist)
}

// file is the path of a modules.dep entry's file.
func (ix *index) file(e depEntry) string {
	if filepath.IsAbs(e.path) {
		return e.path
	}
	return filepath.Join(ix.dir, e.path)
}

// inKernel says whether the module is loaded (Live) or built in.
func (ix *index) inKernel(name string) bool {
	if ls, _, _ := ix.loadedState(name); ls == "Live" {
		return true
	}
	return (ix.builtinErr == nil && ix.builtin[name]) || ix.sysBuiltin(name)
}
