// Package vmbench runs make bench's harness (test/bench) inside the test
// VM, in IPVS mode, which the host's kernel lacks: kube-proxy v1.37.2 and
// proxyshift's agent one after the other in the same lab, on the same
// Services and EndpointSlices of the host's API server (hack/vm/apiserver),
// measured from outside the same way as on the host: the first full sync
// until the last Service answers, one-endpoint changes from the
// EndpointSlice write until a connection reaches the new endpoint, and
// the peak RSS.
//
// `make test-vm` runs it at a small size as a test: both programs must
// serve every Service, carry every change and answer every connection.
// `make bench-vm` runs it at 1k and 5k Services and writes the report into
// docs/benchmarks.md (hack/vm/bench-report.sh). Under emulation the
// figures compare the two programs with each other, never with the host's.
package vmbench
