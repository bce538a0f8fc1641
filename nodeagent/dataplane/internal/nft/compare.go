package nft

import (
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/proxyshift/proxyshift/nodeagent/nsexec"
)

// nftaSetElemKeyEnd is NFTA_SET_ELEM_KEY_END (Linux 5.6), the last key of
// a range of a concatenation; golang.org/x/sys does not name it.
const nftaSetElemKeyEnd = 10

// ElementTexts are the kernel's elements for elems of s (as AddElements
// writes them), each as the text ElementText gives a kernel element: what
// a listing of s must hold when nothing changed it since.
func ElementTexts[E any](s *nftables.Set, elems []E, elem func(*E) Element) []string {
	kernel := kernelElements(s, elems, elem)
	out := make([]string, len(kernel))
	for i, e := range kernel {
		out[i] = ElementText(e)
	}
	return out
}

// ElementText is one element of a set as the kernel lists it, as text
// that compares: key, end of the range, interval-end flag, data and
// verdict (not the comment, which is the element's user data).
func ElementText(e nftables.SetElement) string {
	var b strings.Builder
	b.WriteString(hex.EncodeToString(e.Key))
	if len(e.KeyEnd) > 0 {
		b.WriteByte('-')
		b.WriteString(hex.EncodeToString(e.KeyEnd))
	}
	if e.IntervalEnd {
		b.WriteString(" end")
	}
	if len(e.Val) > 0 {
		b.WriteString(" : ")
		b.WriteString(hex.EncodeToString(e.Val))
	}
	if v := e.VerdictData; v != nil {
		b.WriteString(" : ")
		b.WriteString(strconv.Itoa(int(v.Kind)))
		b.WriteByte(' ')
		b.WriteString(v.Chain)
	}
	return b.String()
}

// SetElementTexts lists the elements of set in table (family fam) in
// network namespace netns, each as ElementText gives it, from one dump.
// (google/nftables reads elements back without their verdicts.)
func SetElementTexts(netns nsexec.NS, fam nftables.TableFamily, table, set string) ([]string, error) {
	ae := netlink.NewAttributeEncoder()
	ae.String(unix.NFTA_SET_ELEM_LIST_TABLE, table)
	ae.String(unix.NFTA_SET_ELEM_LIST_SET, set)
	var out []string
	var bad error
	err := dumpWith(netns, fam, unix.NFT_MSG_GETSETELEM, ae, func(ad *netlink.AttributeDecoder) {
		for ad.Next() {
			if ad.Type() != unix.NFTA_SET_ELEM_LIST_ELEMENTS {
				continue
			}
			ad.Nested(func(list *netlink.AttributeDecoder) error {
				for list.Next() {
					list.Nested(func(elem *netlink.AttributeDecoder) error {
						e, err := decodeElement(elem)
						if err != nil {
							bad = err
						}
						out = append(out, ElementText(e))
						return nil
					})
				}
				return nil
			})
		}
	})
	if err == nil {
		err = bad
	}
	if err != nil {
		return nil, fmt.Errorf("nft: list the elements of %s: %w", set, err)
	}
	return out, nil
}

// decodeElement reads one NFTA_LIST_ELEM: its key, the end of its range,
// its interval-end flag and its data or verdict.
func decodeElement(ad *netlink.AttributeDecoder) (nftables.SetElement, error) {
	var e nftables.SetElement
	value := func(dst *[]byte) func(*netlink.AttributeDecoder) error {
		return func(d *netlink.AttributeDecoder) error {
			for d.Next() {
				if d.Type() == unix.NFTA_DATA_VALUE {
					*dst = d.Bytes()
				}
			}
			return nil
		}
	}
	for ad.Next() {
		switch ad.Type() {
		case unix.NFTA_SET_ELEM_KEY:
			ad.Nested(value(&e.Key))
		case nftaSetElemKeyEnd:
			ad.Nested(value(&e.KeyEnd))
		case unix.NFTA_SET_ELEM_FLAGS:
			e.IntervalEnd = binary.BigEndian.Uint32(ad.Bytes())&unix.NFT_SET_ELEM_INTERVAL_END != 0
		case unix.NFTA_SET_ELEM_DATA:
			ad.Nested(func(d *netlink.AttributeDecoder) error {
				for d.Next() {
					switch d.Type() {
					case unix.NFTA_DATA_VALUE:
						e.Val = d.Bytes()
					case unix.NFTA_DATA_VERDICT:
						v := &Verdict{}
						d.Nested(func(vd *netlink.AttributeDecoder) error {
							for vd.Next() {
								switch vd.Type() {
								case unix.NFTA_VERDICT_CODE:
									v.Kind = expr.VerdictKind(int32(binary.BigEndian.Uint32(vd.Bytes())))
								case unix.NFTA_VERDICT_CHAIN:
									v.Chain = vd.String()
								}
							}
							return nil
						})
						e.VerdictData = v.Expr()
					}
				}
				return nil
			})
		}
	}
	return e, ad.Err()
}
