package kmod

import (
	"testing"
)

func TestCanonical(t *testing.T) {
	for in, want := range map[string]string{
		"ip_vs":                                  "ip_vs",
		"ip-vs":                                  "ip_vs",
		"xt_MASQUERADE":                          "xt_MASQUERADE",
		"kernel/arch/x86/crypto/crc32c-intel.ko": "crc32c_intel",
		"kernel/net/netfilter/nft_ct.ko.zst":     "nft_ct",
		"/lib/modules/6.1.0/kernel/lib/libcrc32c.ko.xz": "libcrc32c",
	} {
		if got := canonical(in); got != want {
			t.Errorf("canonical(%q) = %q; want %q", in, got, want)
		}
	}
}
