package kmod

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
)

// Module is what Probe found out about one module.
type Module struct {
	// Name is the module asked for, with dashes spelt as underscores.
	Name string
	// Resolved is the module that provides Name on this kernel: Name
	// itself, or its successor when the kernel renamed it (asking for
	// nf_conntrack_ipv4 on Linux 4.19 or later resolves to nf_conntrack).
	Resolved string
	// State is Resolved's state.
	State v1alpha1.ModuleState
	// Reason says which source gave the state or, for Missing and Unknown,
	// what is missing or could not be read.
	Reason string
}

// KernelModule is the module as the agent reports it in its ProxyNode
// status: under the name the kernel knows it by.
func (m Module) KernelModule() v1alpha1.KernelModule {
	return v1alpha1.KernelModule{Name: m.Resolved, State: m.State}
}

// Probe tells the state of each named module, in the order asked. It
// never fails: what cannot be told is Unknown, with the reason.
func (k *Kernel) Probe(names ...string) []Module {
	ix := k.read()
	out := make([]Module, 0, len(names))
	for _, n := range names {
		r := ix.resolve(n)
		st, reason := ix.state(r)
		if r != canonical(n) {
			reason = fmt.Sprintf("%s has no %s: it became %s; %s", ix.dir, canonical(n), r, reason)
		}
		out = append(out, Module{Name: canonical(n), Resolved: r, State: st, Reason: reason})
	}
	return out
}

// resolve is the module that provides name: name itself, unless the kernel
// renamed it and has definitely no module of the old name.
func (ix *index) resolve(name string) string {
	n := canonical(name)
	if next, ok := renamed[n]; ok {
		if st, _ := ix.state(n); st == v1alpha1.ModuleMissing {
			return next
		}
	}
	return n
}

// state tells one module's state, and why.
func (ix *index) state(name string) (v1alpha1.ModuleState, string) {
	ls, known, reason := ix.loadedState(name)
	switch {
	case ls == "Live":
		return v1alpha1.ModuleLoaded, reason
	case ls != "":
		// Loading or Unloading: on its way in or out.
		return v1alpha1.ModuleUnknown, reason
	}
	if ix.builtinErr == nil && ix.builtin[name] {
		return v1alpha1.ModuleBuiltIn, "listed in " + filepath.Join(ix.dir, "modules.builtin")
	}
	if ix.sysBuiltin(name) {
		return v1alpha1.ModuleBuiltIn, filepath.Join(ix.sysModule, name) + " has no initstate"
	}
	if !known {
		return v1alpha1.ModuleUnknown, reason
	}
	if ix.depErr == nil {
		if e, ok := ix.dep[name]; ok {
			if err := ix.filesPresent(name, e); err != nil {
				return v1alpha1.ModuleMissing, err.Error()
			}
			return v1alpha1.ModuleLoadable, fmt.Sprintf("%s in %s", e.path, filepath.Join(ix.dir, "modules.dep"))
		}
	}
	switch {
	case ix.depErr != nil:
		return v1alpha1.ModuleUnknown, "cannot read modules.dep: " + ix.depErr.Error()
	case ix.builtinErr != nil:
		return v1alpha1.ModuleUnknown, "cannot read modules.builtin: " + ix.builtinErr.Error()
	}
	return v1alpha1.ModuleMissing, fmt.Sprintf("not loaded, and neither modules.builtin nor modules.dep of %s lists it", ix.dir)
}

// filesPresent checks that the files exist of a module and of those of
// its dependencies that are not already in the kernel.
func (ix *index) filesPresent(name string, e depEntry) error {
	if err := fileExists(ix.file(e)); err != nil {
		return fmt.Errorf("%s is in modules.dep but its file is not there: %w", name, err)
	}
	for _, d := range e.deps {
		if ix.inKernel(d) {
			continue
		}
		de, ok := ix.dep[d]
		if !ok {
			return fmt.Errorf("dependency %s is not in modules.dep", d)
		}
		if err := fileExists(ix.file(de)); err != nil {
			return fmt.Errorf("dependency %s: file not there: %w", d, err)
		}
	}
	return nil
}

func fileExists(path string) error {
	st, err := os.Stat(path)
	switch {
	case err != nil && errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("%s does not exist", path)
	case err != nil:
		return err
	case !st.Mode().IsRegular():
		return fmt.Errorf("%s is not a regular file", path)
	}
	return nil
}
