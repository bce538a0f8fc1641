package iptables

import (
	"context"
	"strings"
	"testing"
)

// variants lists both variants, legacy first.
var variants = []Variant{Legacy, NFT}

// A restore that fails names the line of its input it stopped at, and the
// error quotes that line, whichever way the command reports it: the
// kernel refusing the table's transaction ("line N failed") or the
// command refusing to parse a rule ("Error occurred at line: N"). The
// table holds nothing of the failed input afterwards.
func TestKernelRestoreErrorQuotesTheLine(t *testing.T) {
	for _, v := range variants {
		for _, c := range []struct {
			name, chain, spec string
		}{
			{"refused by the kernel", "PROXYSHIFT-NOT-DECLARED", "-j ACCEPT"},
			{"not parsed", "PROXYSHIFT-TEST", "-m statistic --mode random --probability 0.5 -j DNAT --to-destination 198.18.0.1:80"},
		} {
			t.Run(string(v)+"/"+c.name, func(t *testing.T) {
				ns := kernelNS(t, v)
				in := newRestoreInput("nat")
				in[0].head.declare = []string{"PROXYSHIFT-TEST"}
				in[0].head.appendRules("PROXYSHIFT-TEST", "-j RETURN")
				in[0].tail.appendRules(c.chain, c.spec)
				err := (runner{variant: v, netns: ns.NS()}).restore(context.Background(), ipv4, in)
				if err == nil {
					t.Fatal("the restore succeeded")
				}
				want := `(input line 4: "-A ` + c.chain + " " + c.spec + `")`
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not quote the line: want %s", err, want)
				}
				if saved := ipt(t, ns, v, false, "save", "", "-t", "nat"); strings.Contains(saved, "PROXYSHIFT-TEST") {
					t.Errorf("the failed input left something behind:\n%s", saved)
				}
			})
		}
	}
}
