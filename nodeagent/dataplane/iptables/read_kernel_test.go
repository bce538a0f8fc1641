package iptables

import (
	"context"
	"slices"
	"testing"

	"github.com/proxyshift/proxyshift/nodeagent/dataplane"
)

// The nft variant reads its tables over netlink and iptables -S; what it
// reads agrees with iptables-nft-save.
func TestKernelReadMatchesSave(t *testing.T) {
	ns := kernelNS(t, NFT)
	b := newKernelBackend(t, ns, NFT)
	ctx := context.Background()
	if _, err := b.Sync(ctx, dataplane.SyncRequest{Model: kernelModel(), Full: true}); err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		got, err := b.run.read(ctx, f, sharedChains, true)
		if err != nil {
			t.Fatal(err)
		}
		want, err := parseSave([]byte(ipt(t, ns, NFT, f == ipv6, "save", "")))
		if err != nil {
			t.Fatal(err)
		}
		for _, table := range tables {
			g, w := got[table], want[table]
			if g == nil || w == nil {
				t.Fatalf("%s %s: read %v, saved %v", f.tool, table, g != nil, w != nil)
			}
			// iptables-nft-save lists every built-in chain of a table,
			// also those nothing created yet.
			saved := slices.DeleteFunc(slices.Clone(w.chains), func(c string) bool {
				return w.builtin[c] && w.counts[c] == 0 && !slices.Contains(g.chains, c)
			})
			if !slices.Equal(slices.Sorted(slices.Values(g.chains)), slices.Sorted(slices.Values(saved))) {
				t.Errorf("%s %s chains: read %v, saved %v", f.tool, table, g.chains, saved)
			}
			for _, c := range saved {
				if g.counts[c] != w.counts[c] || g.builtin[c] != w.builtin[c] {
					t.Errorf("%s %s %s: read %d rules (built-in %v), saved %d (%v)", f.tool, table, c, g.counts[c], g.builtin[c], w.counts[c], w.builtin[c])
				}
				if (w.builtin[c] || sharedChains[c]) && !slices.Equal(g.rules[c], w.rules[c]) {
					t.Errorf("%s %s %s: read rules %q, saved %q", f.tool, table, c, g.rules[c], w.rules[c])
				}
			}
		}
	}
}
