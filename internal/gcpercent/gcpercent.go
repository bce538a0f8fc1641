// Package gcpercent gives a proxyshift binary a --gc-percent flag: the
// GOGC it sets at start. Go's default, 100, lets the heap grow to twice
// what is live before a collection. proxyshift's binaries keep most of
// what they allocate (informer caches, the agent's model and programmed
// state), so their peak memory is set by that pacing, and each binary
// ships a lower default, chosen and measured where its flag is bound.
// An operator who wants Go's pacing back sets the flag or GOGC.
package gcpercent

import (
	"flag"
	"os"
	"runtime/debug"
	"strconv"
)

// Flag is a binary's --gc-percent flag, bound to a flag set.
type Flag struct {
	fs    *flag.FlagSet
	value *int
	def   int
}

// Bind registers --gc-percent on fs with def as its default; usage
// says why the binary chose def. Call Apply after fs is parsed.
func Bind(fs *flag.FlagSet, def int, usage string) *Flag {
	return &Flag{fs: fs, value: fs.Int("gc-percent", def, usage+" The GOGC environment variable is used when this flag is not given."), def: def}
}

// Apply sets the collector's GOGC to the one percent picks.
func (f *Flag) Apply() {
	given := false
	f.fs.Visit(func(fl *flag.Flag) { given = given || fl.Name == "gc-percent" })
	if pct, set := percent(*f.value, given, os.Getenv("GOGC"), f.def); set {
		debug.SetGCPercent(pct)
	}
}

// percent is the GOGC to set at start (set false: leave the runtime's,
// read from the GOGC environment variable): the flag's value when given,
// else the environment's GOGC when the runtime understood it (it applied
// it already), else def.
func percent(flagValue int, flagGiven bool, env string, def int) (pct int, set bool) {
	if flagGiven {
		return flagValue, true
	}
	if env != "" {
		if _, err := strconv.Atoi(env); err == nil || env == "off" {
			return 0, false
		}
	}
	return def, true
}
