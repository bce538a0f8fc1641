package kmod

import (
	"errors"
	"fmt"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
)

// ErrMissing is what a load error wraps when the kernel has no such module:
// it is not loaded, not built in, and modules.dep does not list it (or its
// file is gone).
var ErrMissing = errors.New("module not found")

// ErrUnknown is what a load error wraps when the module's state cannot be
// told: a file that would tell could not be read, or the module is half
// way in or out of the kernel. Load does not try its luck.
var ErrUnknown = errors.New("module state unknown")

// Error is a module that could not be loaded, and why.
type Error struct {
	// Module is the module asked for.
	Module string
	// Dependency is the dependency of Module that failed; empty when
	// Module itself failed.
	Dependency string
	// Err is the reason: it wraps ErrMissing, ErrUnknown, or the kernel's
	// errno (unix.EPERM when the agent may not load modules).
	Err error
}

// Error names the module, the failed dependency if any, and the reason.
func (e *Error) Error() string {
	if e.Dependency != "" {
		return fmt.Sprintf("load kernel module %s: dependency %s: %v", e.Module, e.Dependency, e.Err)
	}
	return fmt.Sprintf("load kernel module %s: %v", e.Module, e.Err)
}

// Unwrap returns the reason.
func (e *Error) Unwrap() error { return e.Err }

// Load loads each named module, after its dependencies, unless it is
// already loaded or built in. It returns nil when every module is in the
// kernel afterwards, and otherwise one *Error per module that is not
// (joined with errors.Join), each naming the module and why.
func (k *Kernel) Load(names ...string) error {
	l := &loader{k: k, ix: k.read(), done: map[string]bool{}, visiting: map[string]bool{}}
	var errs []error
	for _, n := range names {
		r := l.ix.resolve(n)
		failed, err := l.module(r)
		if err == nil {
			continue
		}
		e := &Error{Module: canonical(n), Err: err}
		if failed != r {
			e.Dependency = failed
		}
		if r != e.Module {
			e.Err = fmt.Errorf("this kernel has it as %s: %w", r, err)
		}
		errs = append(errs, e)
	}
	return errors.Join(errs...)
}

// loader is one Load call.
type loader struct {
	k  *Kernel
	ix *index
	// done are the modules inserted (or found in the kernel) by this call.
	done map[string]bool
	// visiting are the modules being loaded further up the call chain; it
	// stops a loop in a malformed modules.dep or modules.softdep.
	visiting map[string]bool
}

// module inserts one module after its dependencies. On failure it names
// the module that failed: name or one of its dependencies.
func (l *loader) module(name string) (failed string, err error) {
	if l.done[name] {
		return "", nil
	}
	st, reason := l.ix.state(name)
	switch st {
	case v1alpha1.ModuleLoaded, v1alpha1.ModuleBuiltIn:
		l.done[name] = true
		return "", nil
	case v1alpha1.ModuleMissing:
		if e, ok := l.ix.dep[name]; !ok || fileExists(l.ix.file(e)) != nil {
			return name, fmt.Errorf("%w: %s", ErrMissing, reason)
		}
		// Its file is there but a dependency's is not: the walk below
		// names the dependency.
	case v1alpha1.ModuleUnknown:
		return name, fmt.Errorf("%w: %s", ErrUnknown, reason)
	}
	if l.visiting[name] {
		return name, fmt.Errorf("%s depends on itself in %s", name, l.ix.dir)
	}
	l.visiting[name] = true
	defer delete(l.visiting, name)

	e := l.ix.dep[name]
	// modules.dep lists the dependencies that need the others last:
	// insert from the end.
	for i := len(e.deps) - 1; i >= 0; i-- {
		if f, err := l.module(e.deps[i]); err != nil {
			return f, err
		}
	}
	soft := l.softdeps(name)
	l.soft(soft.pre)
	if err := l.insert(e); err != nil {
		return name, err
	}
	l.done[name] = true
	l.soft(soft.post)
	return "", nil
}

// softdeps are the module's soft dependencies, reading modules.softdep on
// first use.
func (l *loader) softdeps(name string) softdeps {
	if l.ix.softdep == nil {
		l.ix.softdep = readSoftdeps(filepath.Join(l.ix.dir, "modules.softdep"))
	}
	return l.ix.softdep[name]
}

// soft loads soft dependencies, best effort: a soft dependency is a module
// name or an alias (libcrc32c's "pre: crc32c"), and one that fails to
// load is no error, as with modprobe.
func (l *loader) soft(names []string) {
	for _, s := range names {
		n := canonical(s)
		targets := []string{n}
		if _, ok := l.ix.dep[n]; !ok && !l.ix.inKernel(n) {
			if l.ix.alias == nil {
				l.ix.alias = readAliases(filepath.Join(l.ix.dir, "modules.alias"))
			}
			targets = l.ix.alias[n]
		}
		for _, t := range targets {
			_, _ = l.module(t)
		}
	}
}

// insert loads one module file. A module the kernel already has (EEXIST:
// loaded meanwhile by someone else) is success.
func (l *loader) insert(e depEntry) error {
	path := l.ix.file(e)
	ins := l.k.insert
	if ins == nil {
		ins = l.ix.insertFile
	}
	err := ins(path)
	if err == nil || errors.Is(err, unix.EEXIST) {
		return nil
	}
	return fmt.Errorf("%s: %w", path, explain(err))
}

// hints say what an errno from finit_module or init_module means here.
var hints = map[unix.Errno]string{
	unix.EPERM:        "permission denied: loading modules needs CAP_SYS_MODULE in the host's user namespace, and kernel.modules_disabled must be 0",
	unix.ENOEXEC:      "invalid module format: built for another kernel, or a corrupt file",
	unix.ENOKEY:       "module signature required, but its key is not trusted",
	unix.EKEYREJECTED: "module signature rejected",
	unix.ENOENT:       "unknown symbol: the module does not fit this kernel, or a dependency is missing from modules.dep",
	unix.EBUSY:        "the kernel is busy with a module of that name",
}

// explain adds a hint to an errno; errors.Is still finds the errno.
func explain(err error) error {
	var errno unix.Errno
	if errors.As(err, &errno) {
		if h, ok := hints[errno]; ok {
			return fmt.Errorf("%w (%s)", err, h)
		}
	}
	return err
}
