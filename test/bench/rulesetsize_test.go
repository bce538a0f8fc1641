package bench

import (
	"strings"
	"testing"
)

// TestSizeRuleset sizes a listing with both kinds of element lists:
// named sets wrapped over lines, and an anonymous map inside a rule.
func TestSizeRuleset(t *testing.T) {
	listing := `table ip kube-proxy {
	comment "rules for kube-proxy"
	set cluster-ips {
		type ipv4_addr
		comment "Active ClusterIPs"
		elements = { 198.19.1.0, 198.19.1.1,
			     198.19.1.2 }
	}

	map service-ips {
		type ipv4_addr . inet_proto . inet_service : verdict
		elements = { 198.19.1.0 . tcp . 80 : goto service-AAAAAAAA-default/svc-00000/tcp/http }
	}

	set empty {
		type ipv4_addr
	}

	chain nat-output {
		type nat hook output priority dstnat; policy accept;
		jump services
	}

	chain service-AAAAAAAA-default/svc-00000/tcp/http {
		ip daddr 198.19.1.0 tcp dport 80 ip saddr != 198.18.128.0/17 jump mark-for-masquerade
		meta l4proto tcp dnat ip addr . port to numgen random mod 2 map { 0 : 198.18.128.0 . 8080, 1 : 198.18.128.1 . 8080 }
	}
}
`
	got := SizeRuleset(listing)
	want := RulesetSize{Bytes: len(listing), Chains: 2, Rules: 3, Sets: 3, Elements: 4, AnonElements: 2}
	got.RuleBytes, got.ElementBytes, got.OtherBytes = 0, 0, 0
	if got != want {
		t.Errorf("counts = %+v, want %+v", got, want)
	}
	sized := SizeRuleset(listing)
	if sized.RuleBytes+sized.ElementBytes+sized.OtherBytes != len(listing) {
		t.Errorf("parts %d + %d + %d do not add up to %d", sized.RuleBytes, sized.ElementBytes, sized.OtherBytes, len(listing))
	}
	wantElements := len("\t\telements = { 198.19.1.0, 198.19.1.1,\n\t\t\t     198.19.1.2 }\n") +
		len("\t\telements = { 198.19.1.0 . tcp . 80 : goto service-AAAAAAAA-default/svc-00000/tcp/http }\n")
	if sized.ElementBytes != wantElements {
		t.Errorf("element bytes = %d, want %d", sized.ElementBytes, wantElements)
	}
	if e := SizeRuleset(""); e != (RulesetSize{}) {
		t.Errorf("empty listing sized %+v", e)
	}
}

// TestReportRulesetRow checks the report's ruleset-size row: both sizes
// and their ratio, with the target at the largest size only.
func TestReportRulesetRow(t *testing.T) {
	results := sampleResults()
	for i := range results {
		if results[i].Mode == "nftables" {
			results[i].Ruleset.Bytes = 4_600_000
			if results[i].Program == "proxyshift" {
				results[i].Ruleset.Bytes = 3_450_000
			}
		}
	}
	md := (&Report{Results: results}).Markdown()
	for _, want := range []string{
		"| ruleset size (`nft list ruleset`), 1000 services | 4.60 MB | 3.45 MB | 0.75 |  |",
		"| ruleset size (`nft list ruleset`), 10000 services | 4.60 MB | 3.45 MB | 0.75 | <= 1.0x kube-proxy: met |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q:\n%s", want, md)
		}
	}
}
