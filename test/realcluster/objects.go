package realcluster

import (
	"context"
	"fmt"
	"strings"

	"github.com/proxyshift/proxyshift/nodeagent/cleanup"
)

// Objects is what one node's kernel holds of kube-proxy and of
// proxyshift, named as cleanup.KubeProxy and cleanup.Proxyshift own them:
// chains by tool and table ("iptables-nft-save nat KUBE-SERVICES", from
// iptables-save of both backends and both families) and nftables tables
// ("nft ip proxyshift").
type Objects struct {
	KubeProxy, Proxyshift []string
}

// Objects reads what the node's kernel holds, inside the node.
func (n *Node) Objects(ctx context.Context) (Objects, error) {
	var o Objects
	for _, bin := range []string{"iptables-legacy-save", "iptables-nft-save", "ip6tables-legacy-save", "ip6tables-nft-save"} {
		out, err := n.Exec(ctx, bin)
		if err != nil {
			return o, fmt.Errorf("%s: %w", n.Name, err)
		}
		table := ""
		for _, line := range strings.Split(string(out), "\n") {
			if name, ok := strings.CutPrefix(line, "*"); ok {
				table = name
			}
			chain, ok := strings.CutPrefix(line, ":")
			if !ok {
				continue
			}
			chain, _, _ = strings.Cut(chain, " ")
			where := fmt.Sprintf("%s %s %s", bin, table, chain)
			if cleanup.KubeProxy.Chain(table, chain) {
				o.KubeProxy = append(o.KubeProxy, where)
			}
			if cleanup.Proxyshift.Chain(table, chain) {
				o.Proxyshift = append(o.Proxyshift, where)
			}
		}
	}
	out, err := n.Exec(ctx, "nft", "list", "tables")
	if err != nil {
		return o, fmt.Errorf("%s: nft list tables: %w", n.Name, err)
	}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) != 3 || f[0] != "table" {
			continue
		}
		if cleanup.KubeProxy.NFTTable(f[2]) {
			o.KubeProxy = append(o.KubeProxy, "nft "+f[1]+" "+f[2])
		}
		if cleanup.Proxyshift.NFTTable(f[2]) {
			o.Proxyshift = append(o.Proxyshift, "nft "+f[1]+" "+f[2])
		}
	}
	return o, nil
}

// Summary counts the objects by owner, for people: "kube-proxy: 42
// chains; proxyshift: table ip proxyshift, table ip6 proxyshift".
func (o Objects) Summary() string {
	part := func(who string, objs []string) string {
		chains := 0
		var tables []string
		for _, x := range objs {
			if t, ok := strings.CutPrefix(x, "nft "); ok {
				tables = append(tables, "table "+t)
			} else {
				chains++
			}
		}
		var bits []string
		if chains > 0 {
			bits = append(bits, fmt.Sprintf("%d chains", chains))
		}
		bits = append(bits, tables...)
		if len(bits) == 0 {
			bits = []string{"nothing"}
		}
		return who + ": " + strings.Join(bits, ", ")
	}
	return part("kube-proxy", o.KubeProxy) + "; " + part("proxyshift", o.Proxyshift)
}
