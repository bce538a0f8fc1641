package nft

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"strings"
	"testing"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"
)

// TestSetUserdataIsNFTs compares the user data written for the sets of
// numgen keys with what nft (nftables 1.0.6, `nft --debug=mnl -f`) writes
// for the same declarations.
func TestSetUserdataIsNFTs(t *testing.T) {
	if binary.NativeEndian.Uint16([]byte{1, 0}) != 1 {
		t.Skip("the bytes nft wrote were read on a little-endian machine; this one is big-endian")
	}
	const (
		head = "000401000000 010400000000 031a 000417000000 0112 000401000000 010400000100 020400000000"
		tail = "060400000000"
	)
	for _, tc := range []struct {
		decl string
		set  Set
		want string
	}{{
		decl: "typeof numgen random mod 65536 : verdict",
		set:  Set{Name: "m", NumgenKey: 65536, VerdictMap: true},
		want: head + "0408 000401000000 0100" + tail,
	}} {
		got, err := tc.set.Userdata()
		if err != nil {
			t.Fatal(err)
		}
		want, err := hex.DecodeString(strings.ReplaceAll(tc.want, " ", ""))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s: user data\n%x, nft writes\n%x", tc.decl, got, want)
		}
		if text := "typeof " + tc.set.Typeof(); text != tc.decl {
			t.Errorf("listed as %q, nft lists %q", text, tc.decl)
		}
	}
	if _, err := (&Set{Name: "m", NumgenKey: 8, DataType: nftables.TypeIPAddr}).Userdata(); err == nil {
		t.Error("a map of numgen keys to addresses got user data; want an error (nft's description of it is not known)")
	}
}

// TestWithSetUserdata replaces a new-set message's user data and keeps
// its other attributes as they were.
func TestWithSetUserdata(t *testing.T) {
	nfgen := []byte{unix.NFPROTO_IPV4, 0, 0, 0}
	join := func(parts ...[]byte) []byte { return bytes.Join(append([][]byte{nfgen}, parts...), nil) }
	table, name, id := attr(unix.NFTA_SET_TABLE, []byte("proxyshift\x00")), attr(unix.NFTA_SET_NAME, []byte("m\x00")), attr(unix.NFTA_SET_ID, []byte{0, 0, 0, 1})
	for _, body := range [][]byte{
		join(table, name, attr(unix.NFTA_SET_USERDATA, []byte{0, 4, 2, 0, 0, 0}), id),
		join(table, name, id),
	} {
		got := withSetUserdata(body, []byte("new"))
		if want := join(table, name, id, attr(unix.NFTA_SET_USERDATA, []byte("new"))); !bytes.Equal(got, want) {
			t.Errorf("withSetUserdata(%x)\n= %x, want\n  %x", body, got, want)
		}
	}
}
