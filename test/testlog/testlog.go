// Package testlog sets the log of the controllers that tests run in their
// own process (the operator's reconcilers, through controller-runtime):
// silent by default, so that a test's output is its own, and on stderr
// when PROXYSHIFT_TEST_LOG is set, for reading what the operator did
// around a failure.
package testlog

import (
	"io"
	"os"

	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
)

// Init sets controller-runtime's logger as the package doc says; call it
// once, from a test package's init or TestMain.
func Init() {
	var w io.Writer = io.Discard
	if os.Getenv("PROXYSHIFT_TEST_LOG") != "" {
		w = os.Stderr
	}
	logf.SetLogger(zap.New(zap.UseDevMode(true), zap.WriteTo(w)))
}
