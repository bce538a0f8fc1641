package bench

import (
	"bufio"
	"encoding/json"
	"io"
	"sort"
	"strings"
	"time"
)

// auditEvent is the part of an audit.k8s.io/v1 Event the count reads.
type auditEvent struct {
	Verb      string `json:"verb"`
	ObjectRef *struct {
		Resource    string `json:"resource"`
		Subresource string `json:"subresource"`
		Name        string `json:"name"`
	} `json:"objectRef"`
	ResponseStatus *struct {
		Code int `json:"code"`
	} `json:"responseStatus"`
	StageTimestamp time.Time `json:"stageTimestamp"`
}

// Writes are one program's API writes as the API server's audit log
// recorded them, split at a moment (the ProxyConfig's creation).
type Writes struct {
	// Before and After count the writes made before and after the split,
	// by "verb resource[/subresource]" ("create proxynodes").
	Before, After map[string]int
	// Failed is how many of them the API server refused (status 400 and
	// up: conflicts, mostly); they are counted in Before and After too.
	Failed int
	// PerNode counts the writes to each node's own objects (its Node and
	// its ProxyNode, which share its name), over the whole run.
	PerNode map[string]int
}

// leases is the resource of leader election's Lease, whose renewals
// concern no node.
const leases = "leases"

// perNodeResources are the kinds whose objects are named after a node.
var perNodeResources = map[string]bool{"nodes": true, "proxynodes": true}

// countWrites reads an audit log (one JSON event a line, from
// testenv.LaunchAudited's policy: writes of the audited users only).
func countWrites(r io.Reader, split time.Time) (Writes, error) {
	w := Writes{Before: map[string]int{}, After: map[string]int{}, PerNode: map[string]int{}}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var ev auditEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return w, err
		}
		if ev.ObjectRef == nil {
			continue
		}
		key := ev.ObjectRef.Resource
		if ev.ObjectRef.Subresource != "" {
			key += "/" + ev.ObjectRef.Subresource
		}
		key = ev.Verb + " " + key
		if ev.StageTimestamp.Before(split) {
			w.Before[key]++
		} else {
			w.After[key]++
		}
		if ev.ResponseStatus != nil && ev.ResponseStatus.Code >= 400 {
			w.Failed++
		}
		if perNodeResources[ev.ObjectRef.Resource] && ev.ObjectRef.Name != "" {
			w.PerNode[ev.ObjectRef.Name]++
		}
	}
	return w, sc.Err()
}

// Total is the number of writes, before and after the split, leaving out
// leader election's Lease renewals when withoutLeases.
func (w Writes) Total(withoutLeases bool) int {
	n := 0
	for _, m := range []map[string]int{w.Before, w.After} {
		for k, v := range m {
			if withoutLeases && resourceOf(k) == leases {
				continue
			}
			n += v
		}
	}
	return n
}

// MaxPerNode is the most writes any one node's objects got, and the node.
func (w Writes) MaxPerNode() (string, int) {
	best, most := "", 0
	for name, n := range w.PerNode {
		if n > most || (n == most && name < best) {
			best, most = name, n
		}
	}
	return best, most
}

// Kinds lists the "verb resource" keys seen, sorted.
func (w Writes) Kinds() []string {
	seen := map[string]bool{}
	for _, m := range []map[string]int{w.Before, w.After} {
		for k := range m {
			seen[k] = true
		}
	}
	out := make([]string, 0, len(seen))
	for k := range seen {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// resourceOf is the resource of a "verb resource[/subresource]" key.
func resourceOf(key string) string {
	_, res, _ := strings.Cut(key, " ")
	res, _, _ = strings.Cut(res, "/")
	return res
}
