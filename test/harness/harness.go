// Package harness holds what the local clusters' harnesses (test/cluster,
// the namespace lab; test/realcluster, the real-node cluster) and their
// programs (hack/cluster, hack/cluster-real) share around the cluster they
// build: a run directory, a bring-up timed step by step, the context a
// Ctrl-C ends, and, for tests, running such a program and reading the
// summary it prints.
package harness

import (
	"context"
	"fmt"
	"log"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"
)

// RunDir is a harness's directory: certificates, kubeconfigs, state and
// logs. Processes get Env, a minimal environment with HOME inside it, so
// nothing they write (kubectl's cache, say) lands in the real home.
type RunDir struct {
	// Dir is the directory, LogDir its logs/ (one log per process).
	Dir, LogDir string
	// Env is the processes' environment: HOME=Dir/home.
	Env []string
	// Own says the harness created Dir (and removes it, unless kept).
	Own bool
}

// NewRunDir uses dir, or when empty creates a temporary directory named
// after pattern (os.MkdirTemp), with logs/ and home/ inside.
func NewRunDir(dir, pattern string) (*RunDir, error) {
	r := &RunDir{}
	if dir == "" {
		d, err := os.MkdirTemp("", pattern)
		if err != nil {
			return nil, err
		}
		r.Dir, r.Own = d, true
	} else {
		d, err := filepath.Abs(dir)
		if err != nil {
			return nil, err
		}
		r.Dir = d
	}
	r.LogDir = filepath.Join(r.Dir, "logs")
	home := filepath.Join(r.Dir, "home")
	for _, d := range []string{r.LogDir, home} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	r.Env = []string{"HOME=" + home}
	return r, nil
}

// Remove removes the directory if the harness created it and keep is
// false.
func (r *RunDir) Remove(keep bool) error {
	if r == nil || !r.Own || keep {
		return nil
	}
	return os.RemoveAll(r.Dir)
}

// Timing is how long one step of a bring-up took.
type Timing struct {
	Step     string
	Duration time.Duration
}

// Step runs fn as the bring-up step called name, appends its duration to
// *timings and logs it with logf; the error names the step.
func Step(timings *[]Timing, logf func(string, ...any), name string, fn func() error) error {
	start := time.Now()
	err := fn()
	Record(timings, logf, name, time.Since(start))
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	return nil
}

// Record appends a duration measured otherwise to *timings and logs it.
func Record(timings *[]Timing, logf func(string, ...any), name string, d time.Duration) {
	*timings = append(*timings, Timing{Step: name, Duration: d})
	logf("%-40s %6.2fs", name, d.Seconds())
}

// Quiet is a Logf that logs nothing, the default of the harnesses' options.
func Quiet(string, ...any) {}

// InterruptContext returns a context that the first Ctrl-C (SIGINT) or
// SIGTERM cancels, saying so on the standard logger (or cancel does);
// later signals are ignored, so the teardown that follows always finishes.
func InterruptContext() (context.Context, context.CancelFunc) {
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		s := <-sigs
		log.Printf("%v: tearing the cluster down (further signals are ignored)", s)
		cancel()
		for range sigs {
		}
	}()
	return ctx, cancel
}
