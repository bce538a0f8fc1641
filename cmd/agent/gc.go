package main

// The agent's garbage collector runs at GOGC=50 unless told otherwise
// (--gc-percent, internal/gcpercent): the heap may grow to one and a
// half times what is live, not twice. The agent runs on every node and
// its heap is mostly what it keeps (the informers' objects, the model,
// the programmed state: about 70 MB at 10 000 Services), so its peak
// memory is set by the collector's pacing: at Go's default, 2 x 70 MB
// of heap plus the binary and the runtime, where kube-proxy's whole
// process took 290 MB in make bench. make bench's harness at one size
// (10 000 Services, nftables, one run after another): peak RSS 166 and
// 163 MiB at GOGC=100, 149 and 152 at 50. What it costs is collections
// more often, and the agent allocates in bursts (a full sync, a periodic
// resync's read-back) and little in between: the first sync took 0.79
// and 0.85 s at 100, 0.87 and 0.91 s at 50.

// defaultGCPercent is --gc-percent's default.
const defaultGCPercent = 50
