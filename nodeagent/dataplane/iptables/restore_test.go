package iptables

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	dt "github.com/proxyshift/proxyshift/nodeagent/dataplane/dataplanetest"
	"github.com/proxyshift/proxyshift/nodeagent/model"
	"github.com/proxyshift/proxyshift/nodeagent/nsexec"
)

// text is the input as runner.restore writes it to iptables-restore.
func (in restoreInput) text(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	if err := in.writeTo(&b); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// testPorts are three services: web (ClusterIP, three endpoints), np
// (NodePort) and db (ClusterIP).
func testPorts() map[model.ServicePortName]*model.ServicePort {
	return dt.PortsOf(
		dt.Svc("default", "web", "http", "10.96.0.10", 80,
			dt.EP("10.244.1.2", 8080), dt.EP("10.244.2.3", 8080), dt.EP("10.244.3.4", 8080)),
		dt.Svc("default", "np", "http", "10.96.0.11", 80, dt.NodePort(30080),
			dt.EP("10.244.1.5", 8080, dt.Local), dt.EP("10.244.2.5", 8080)),
		dt.Svc("default", "db", "sql", "10.96.0.12", 5432, dt.EP("10.244.1.9", 5432)),
	)
}

func nameOf(ns, name, p string) model.ServicePortName {
	return model.ServicePortName{Namespace: ns, Name: name, Port: p, Protocol: corev1.ProtocolTCP}
}

// changeOf pairs the rules rs holds for name with those of sp (nil: the
// port was deleted).
func changeOf(rs *ruleset, name model.ServicePortName, sp *model.ServicePort) portChange {
	ch := portChange{name: name, old: rs.ports[name]}
	if sp != nil {
		ch.new = renderPort(policyFor(node, corev1.IPv4Protocol), sp)
	}
	return ch
}

// perPortChains returns every per-port chain named in input.
func perPortChains(input string) map[string]bool {
	out := map[string]bool{}
	for _, w := range strings.Fields(input) {
		if _, ok := blockKey(strings.TrimPrefix(w, ":")); ok {
			out[strings.TrimPrefix(w, ":")] = true
		}
	}
	return out
}

// chainsOfPort returns the names of the chains pr has.
func chainsOfPort(prs ...*portRules) map[string]bool {
	out := map[string]bool{}
	for _, pr := range prs {
		for _, c := range pr.chains {
			out[c.name] = true
		}
	}
	return out
}

func TestIncrementalEndpointChangeTouchesOnlyItsPort(t *testing.T) {
	ports := testPorts()
	rs := render(policyFor(node, corev1.IPv4Protocol), ports)
	name := nameOf("default", "np", "http")
	sp := *ports[name]
	sp.Endpoints = slices.Clone(sp.Endpoints)
	sp.Endpoints[1].Port = 9090 // one endpoint replaced by another

	ch := changeOf(rs, name, &sp)
	input := incrementalRestore([]portChange{ch}).text(t)
	t.Logf("restore input:\n%s", input)

	mine := chainsOfPort(ch.old, ch.new)
	for c := range perPortChains(input) {
		if !mine[c] {
			t.Errorf("input names chain %s of another port", c)
		}
	}
	n := namesFor(name)
	for _, want := range []string{
		":" + n.service + " - [0:0]", // rewritten: it chooses the new endpoint
		"-A " + n.service + ` -p tcp -j DNAT --to-destination 10.244.2.5:9090`,
	} {
		if !strings.Contains(input, want+"\n") {
			t.Errorf("input lacks %q", want)
		}
	}
	for _, unwanted := range []string{
		":" + n.external, // unchanged
		":" + n.local,    // not used (externalTrafficPolicy Cluster)
		"-X ",            // no chain of its goes
		"*filter",        // nothing changed there
		"-D ", "-I ",     // the port's shared rules are the same (its local endpoint's hairpin rule too)
		":" + chainServices, ":" + chainNodePorts, ":" + chainPostrouting, // fixed chains are never flushed
	} {
		if strings.Contains(input, unwanted) {
			t.Errorf("input contains %q", unwanted)
		}
	}
}

// TestIncrementalHairpinRules: a local endpoint's hairpin rule lives in
// PROXYSHIFT-POSTROUTING, ahead of the masquerade bit's test; when the
// local endpoint is replaced, its rule is deleted by its text and the new
// one's inserted at the top. A remote endpoint has none.
func TestIncrementalHairpinRules(t *testing.T) {
	ports := testPorts()
	rs := render(policyFor(node, corev1.IPv4Protocol), ports)
	name := nameOf("default", "np", "http")
	hairpin := func(ip string) string {
		return "-s " + ip + "/32 -d " + ip + `/32 -m conntrack --ctstate DNAT -m comment --comment "default/np:http/TCP hairpin" -j ` + chainMarkMasq
	}
	if got := rs.ports[name].shared; !slices.Contains(got, sharedRule{table: tableNAT, chain: chainPostrouting, spec: hairpin("10.244.1.5")}) ||
		slices.ContainsFunc(got, func(r sharedRule) bool { return strings.Contains(r.spec, "10.244.2.5") }) {
		t.Fatalf("np's shared rules %q: want the hairpin rule of its local endpoint 10.244.1.5 and none for the remote 10.244.2.5", got)
	}
	sp := *ports[name]
	sp.Endpoints = slices.Clone(sp.Endpoints)
	sp.Endpoints[0].IP = netip.MustParseAddr("10.244.1.6") // the local endpoint replaced by another

	input := incrementalRestore([]portChange{changeOf(rs, name, &sp)}).text(t)
	t.Logf("restore input:\n%s", input)
	for _, want := range []string{
		"-D " + chainPostrouting + " " + hairpin("10.244.1.5"),
		"-I " + chainPostrouting + " 1 " + hairpin("10.244.1.6"),
	} {
		if !strings.Contains(input, want+"\n") {
			t.Errorf("input lacks %q", want)
		}
	}
}

func TestIncrementalSharedRules(t *testing.T) {
	ports := testPorts()
	rs := render(policyFor(node, corev1.IPv4Protocol), ports)
	name := nameOf("default", "web", "http")
	sp := *ports[name]
	sp.Endpoints = nil // loses every endpoint: rejected from now on
	n := namesFor(name)

	input := incrementalRestore([]portChange{changeOf(rs, name, &sp)}).text(t)
	t.Logf("restore input:\n%s", input)
	want := []string{
		"*nat",
		":" + n.service + " - [0:0]",
		"-D " + chainServices + ` -d 10.96.0.10/32 -p tcp -m comment --comment "default/web:http/TCP cluster IP" -m tcp --dport 80 -j ` + n.service,
		"-X " + n.service,
		"*filter",
		"-I " + chainEndpointsCheck + ` 1 -d 10.96.0.10/32 -p tcp -m comment --comment "default/web:http/TCP has no endpoints" -m tcp --dport 80 -j REJECT --reject-with tcp-reset`,
	}
	last := -1
	for _, w := range want {
		i := strings.Index(input, w+"\n")
		if i < 0 {
			t.Errorf("input lacks %q", w)
			continue
		}
		if i < last {
			t.Errorf("%q comes too early", w)
		}
		last = i
	}
	if got := len(perPortChains(input)); got != 1 { // the service chain: endpoints have none
		t.Errorf("input names %d per-port chains, want 1", got)
	}
}

func TestIncrementalDeletedPort(t *testing.T) {
	ports := testPorts()
	rs := render(policyFor(node, corev1.IPv4Protocol), ports)
	name := nameOf("default", "np", "http")
	ch := changeOf(rs, name, nil)
	input := incrementalRestore([]portChange{ch}).text(t)
	for c := range chainsOfPort(ch.old) {
		if !strings.Contains(input, "-X "+c+"\n") {
			t.Errorf("chain %s is not deleted", c)
		}
	}
	for _, r := range ch.old.shared {
		if !strings.Contains(input, "-D "+r.chain+" "+r.spec+"\n") {
			t.Errorf("rule %q of %s is not deleted", r.spec, r.chain)
		}
	}
	if strings.Contains(input, "-A ") || strings.Contains(input, "-I ") {
		t.Errorf("deleting a port adds rules:\n%s", input)
	}
}

func TestIncrementalUnchangedPortIsNoop(t *testing.T) {
	ports := testPorts()
	rs := render(policyFor(node, corev1.IPv4Protocol), ports)
	name := nameOf("default", "web", "http")
	if input := incrementalRestore([]portChange{changeOf(rs, name, ports[name])}); !input.empty() {
		t.Errorf("unchanged port gives input:\n%s", input.text(t))
	}
}

// A full sync reads what is there: it fixes the jump rules (missing,
// duplicated, changed, or leading to chains no longer wanted), deletes stale
// proxyshift chains and leaves everything else alone.
func TestFullRestoreRepairs(t *testing.T) {
	cur, err := parseSave([]byte(`# Generated by iptables-save
*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:KUBE-SERVICES - [0:0]
:PROXYSHIFT-SERVICES - [0:0]
:PROXYSHIFT-SVC-STALESTALEST - [0:0]
:PROXYSHIFT-OLD - [0:0]
-A PREROUTING -m comment --comment "proxyshift service portals" -j PROXYSHIFT-SERVICES
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A PREROUTING -m comment --comment "proxyshift service portals" -j PROXYSHIFT-SERVICES
-A POSTROUTING -j PROXYSHIFT-OLD
-A PROXYSHIFT-SERVICES -j PROXYSHIFT-SVC-STALESTALEST
COMMIT
*filter
:INPUT ACCEPT [0:0]
:FORWARD DROP [0:0]
:OUTPUT ACCEPT [0:0]
:DOCKER - [0:0]
-A INPUT -j PROXYSHIFT-FILTER
-A FORWARD -j DOCKER
COMMIT
`))
	if err != nil {
		t.Fatal(err)
	}
	rs := render(policyFor(node, corev1.IPv4Protocol), testPorts())
	input := fullRestore(rs, cur).text(t)
	t.Logf("restore input:\n%s", input)
	for _, want := range []string{
		`-D PREROUTING -m comment --comment "proxyshift service portals" -j PROXYSHIFT-SERVICES`,
		`-D POSTROUTING -j PROXYSHIFT-OLD`,
		`-D INPUT -j PROXYSHIFT-FILTER`, // changed by hand
		`-I OUTPUT 1 -m comment --comment "proxyshift service portals" -j PROXYSHIFT-SERVICES`,
		`-I POSTROUTING 1 -m comment --comment "proxyshift masquerading" -j PROXYSHIFT-POSTROUTING`,
		`-I INPUT 1 -m conntrack --ctstate NEW -m comment --comment "proxyshift service checks" -j PROXYSHIFT-FILTER`,
		":PROXYSHIFT-SVC-STALESTALEST - [0:0]",
		"-X PROXYSHIFT-SVC-STALESTALEST",
		"-X PROXYSHIFT-OLD",
	} {
		if !strings.Contains(input, want+"\n") {
			t.Errorf("input lacks %q", want)
		}
	}
	if strings.Count(input, "-D PREROUTING") != 1 || strings.Contains(input, "-I PREROUTING") {
		t.Error("the existing PREROUTING jump is not kept exactly once")
	}
	for _, foreign := range []string{"KUBE-", "DOCKER", ":PREROUTING", ":FORWARD"} {
		if strings.Contains(input, foreign) {
			t.Errorf("input touches %s", foreign)
		}
	}
}

func TestCleanupRestore(t *testing.T) {
	cur, err := parseSave([]byte(`*nat
:PREROUTING ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:KUBE-SERVICES - [0:0]
:PROXYSHIFT-SERVICES - [0:0]
:PROXYSHIFT-SVC-AAAAAAAAAAAAA - [0:0]
-A PREROUTING -m comment --comment "proxyshift service portals" -j PROXYSHIFT-SERVICES
-A PREROUTING -j KUBE-SERVICES
-A PROXYSHIFT-SERVICES -j PROXYSHIFT-SVC-AAAAAAAAAAAAA
-A KUBE-SERVICES -j RETURN
COMMIT
*mangle
:PREROUTING ACCEPT [0:0]
:KUBE-IPTABLES-HINT - [0:0]
COMMIT
`))
	if err != nil {
		t.Fatal(err)
	}
	input, removed := cleanupRestore(cur, "iptables-nft")
	want := `*nat
:PROXYSHIFT-SERVICES - [0:0]
:PROXYSHIFT-SVC-AAAAAAAAAAAAA - [0:0]
-D PREROUTING -m comment --comment "proxyshift service portals" -j PROXYSHIFT-SERVICES
-X PROXYSHIFT-SERVICES
-X PROXYSHIFT-SVC-AAAAAAAAAAAAA
COMMIT
`
	if got := input.text(t); got != want {
		t.Errorf("cleanup input:\n%s\nwant:\n%s", got, want)
	}
	wantRemoved := []string{
		"iptables-nft nat rule PREROUTING -> PROXYSHIFT-SERVICES",
		"iptables-nft nat chain PROXYSHIFT-SERVICES",
		"iptables-nft nat chain PROXYSHIFT-SVC-AAAAAAAAAAAAA",
	}
	if !slices.Equal(removed, wantRemoved) {
		t.Errorf("removed %q, want %q", removed, wantRemoved)
	}
	if input, removed := cleanupRestore(savedTables{}, "iptables-nft"); !input.empty() || input.text(t) != "" || removed != nil {
		t.Errorf("nothing to clean up gives %q, %q", input.text(t), removed)
	}
}

func TestCountsMatchSaved(t *testing.T) {
	rs := render(policyFor(nodeWithIPs, corev1.IPv4Protocol), dt.PortsOf(
		dt.Svc("default", "web", "http", "10.96.0.10", 80, dt.NodePort(30080), dt.LB("198.18.100.1"), dt.SourceRanges("203.0.113.0/24"),
			dt.ETPLocal, dt.EP("10.244.1.2", 8080), dt.EP("10.244.2.3", 8080, dt.Local)),
		dt.Svc("default", "empty", "http", "10.96.0.40", 80, dt.NodePort(30040)),
		dt.Svc("default", "cache", "dns", "10.96.0.11", 53, dt.UDP, dt.ITPLocal, dt.EP("10.244.1.2", 53)),
	))
	// What a full sync writes, read back the way iptables-save prints it.
	var save strings.Builder
	for _, line := range strings.Split(fullRestore(rs, nil).text(t), "\n") {
		switch {
		case strings.HasPrefix(line, "*"):
			save.WriteString(line + "\n")
			if line == "*nat" {
				save.WriteString(":PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n")
			} else {
				save.WriteString(":INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n")
			}
		case strings.HasPrefix(line, "-I "):
			f := strings.SplitN(line, " ", 4)
			save.WriteString("-A " + f[1] + " " + f[3] + "\n")
		default:
			save.WriteString(line + "\n")
		}
	}
	cur, err := parseSave([]byte(save.String()))
	if err != nil {
		t.Fatal(err)
	}
	got, want := countSaved(cur), rs.counts()
	// Endpoints counts DNAT rules: web's two cluster endpoints and its
	// local one (cache has no local endpoint, empty none at all).
	if got != want || want.Services != 3 || want.Endpoints != 3 {
		t.Errorf("counted from the kernel's view %+v, from memory %+v; want 3 services, 3 endpoints", got, want)
	}
}

// runner.restore hands iptables-restore its input on standard input, all
// of it, and runs it with restoreTunables: a stand-in for the command
// (first in $PATH) records both.
func TestRunnerRestoreFeedsInputWithTunables(t *testing.T) {
	dir := t.TempDir()
	script := "#!/bin/sh\ncat > \"$0.input\"\necho \"$GLIBC_TUNABLES\" > \"$0.env\"\n"
	cmd := filepath.Join(dir, "iptables-nft-restore")
	if err := os.WriteFile(cmd, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
	t.Setenv("GLIBC_TUNABLES", "")
	in := fullRestore(render(policyFor(node, corev1.IPv4Protocol), testPorts()), nil)
	if err := (runner{variant: NFT}).restore(context.Background(), ipv4, in); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(cmd + ".input")
	if err != nil {
		t.Fatal(err)
	}
	if want := in.text(t); string(got) != want {
		t.Errorf("the command read\n%s\nwant\n%s", got, want)
	}
	env, err := os.ReadFile(cmd + ".env")
	if err != nil {
		t.Fatal(err)
	}
	if want := strings.TrimPrefix(restoreTunables[0], "GLIBC_TUNABLES="); strings.TrimSpace(string(env)) != want {
		t.Errorf("the command ran with GLIBC_TUNABLES=%q, want %q", strings.TrimSpace(string(env)), want)
	}
}

// quoteFailedLine quotes the line a failed restore's message names, in
// both of the command's forms, and nothing when the message names no
// line of the input.
func TestQuoteFailedLine(t *testing.T) {
	in := newRestoreInput("nat")
	in[0].head.declare = []string{"A"}
	in[0].head.appendRules("A", "-j RETURN", strings.Repeat("x", 600))
	long := `"-A A ` + strings.Repeat("x", maxQuoted-len("-A A ")) + `..."`
	for _, c := range []struct{ stderr, want string }{
		{"iptables-nft-restore: line 3 failed: No chain/target/match by that name.", ` (input line 3: "-A A -j RETURN")`},
		{"iptables-restore v1.8.9 (legacy): unknown option\nError occurred at line: 1\nTry `iptables-restore -h'", ` (input line 1: "*nat")`},
		{"iptables-restore: line 4 failed", " (input line 4: " + long + ")"},
		{"iptables-restore: line 9 failed", ""},
		{"iptables-restore: line 0 failed", ""},
		{"Another app is currently holding the xtables lock.", ""},
	} {
		err := fmt.Errorf("iptables: %w", &nsexec.Error{Cmd: "iptables-restore", Err: errors.New("exit status 1"), Stderr: c.stderr})
		if got := quoteFailedLine(err, in); got != c.want {
			t.Errorf("for %q: got %s, want %s", c.stderr, got, c.want)
		}
	}
	if got := quoteFailedLine(errors.New("line 1 failed"), in); got != "" {
		t.Errorf("an error that is not a command's: got %s", got)
	}
}

// TestFillRestoresSplitFullRestore: the restores that fill empty tables
// in parts write, between them, every line fullRestore writes into empty
// tables, each once: the fixed chains and their own rules first, each
// port's chains in one part (the parts share the ports), the ports'
// rules in the fixed chains inserted at the top instead of appended,
// and the jump rules last.
func TestFillRestoresSplitFullRestore(t *testing.T) {
	m := dt.RandomModel(rand.New(rand.NewPCG(3, 1)), 40)
	rs := render(policyFor(node, corev1.IPv4Protocol), m.Ports[corev1.IPv4Protocol])
	if err := rs.collisions(); err != nil {
		t.Fatal(err)
	}
	fixedChains, static := map[string]bool{}, map[string]bool{}
	for _, c := range rs.fixed {
		fixedChains[c.name] = true
		for _, r := range c.rules {
			static["-A "+c.name+" "+r] = true
		}
	}
	// lines returns the input's lines, without the table and COMMIT
	// lines.
	lines := func(in restoreInput) []string {
		var out []string
		for _, l := range strings.Split(strings.TrimSpace(in.text(t)), "\n") {
			if l != "COMMIT" && !strings.HasPrefix(l, "*") {
				out = append(out, l)
			}
		}
		return out
	}
	var want []string
	for _, l := range lines(fullRestore(rs, nil)) {
		// A port's rule in a fixed chain: appended by one restore,
		// inserted at the top by a part.
		if f := strings.Fields(l); f[0] == "-A" && fixedChains[f[1]] && !static[l] {
			l = "-I " + f[1] + " 1 " + strings.TrimPrefix(l, "-A "+f[1]+" ")
		}
		want = append(want, l)
	}

	fixed, ports, hooks := fillRestores(rs, 2)
	var got []string
	for _, l := range lines(fixed) {
		if !static[l] && !(strings.HasPrefix(l, ":") && fixedChains[strings.Fields(l)[0][1:]]) {
			t.Errorf("the fixed chains' restore writes %q", l)
		}
		got = append(got, l)
	}
	for i, in := range ports {
		ls := lines(in)
		if len(ls) == 0 {
			t.Errorf("part %d writes nothing", i)
		}
		for _, l := range ls {
			if strings.HasPrefix(l, ":") && fixedChains[strings.Fields(l)[0][1:]] {
				t.Errorf("part %d declares (flushes) fixed chain %q", i, l)
			}
			if strings.HasPrefix(l, "-A ") && fixedChains[strings.Fields(l)[1]] {
				t.Errorf("part %d appends to fixed chain: %q", i, l)
			}
		}
		got = append(got, ls...)
	}
	hookLines := lines(hooks)
	for _, l := range hookLines {
		if f := strings.Fields(l); f[0] != "-I" || !builtinChains[f[1]] {
			t.Errorf("the jumps' restore writes %q", l)
		}
	}
	if len(hookLines) != len(jumps) {
		t.Errorf("the jumps' restore writes %d lines, want the %d jump rules", len(hookLines), len(jumps))
	}
	got = append(got, hookLines...)
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("the parts write other lines than one restore (- one restore, + the parts, sorted):\n%s", dt.LineDiff(strings.Join(want, "\n"), strings.Join(got, "\n")))
	}
}
