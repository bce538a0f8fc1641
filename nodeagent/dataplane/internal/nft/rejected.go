package nft

import (
	"encoding/binary"
	"fmt"
	"strings"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"
)

// When the kernel refuses a transaction it applies none of it and
// answers the message it refused with an error report: an errno, the
// refused message's header and, with extended acknowledgements, sometimes
// a text. An errno alone ("no such file or directory") does not say
// which of a full sync's hundred thousand messages it was about, so the
// error names the message, read back from the batch that was sent: what
// it did, to which object, and for a rule the expressions it held (a
// kernel without one of them refuses the rule with ENOENT or
// EOPNOTSUPP).

// RejectedError is the kernel's refusal of a transaction, which it
// applied none of.
type RejectedError struct {
	// Errno is the kernel's reason.
	Errno unix.Errno
	// Op says what the refused message did ("add rule to chain ip
	// proxyshift services (expressions: ...)"), "" when the report
	// named no message of the batch.
	Op string
	// Index is the refused message's position in the batch (1 for its
	// first message after the batch's begin), of Count.
	Index, Count int
	// Text is the kernel's own text on the error, when it gave one.
	Text string
}

func (e *RejectedError) Error() string {
	var b strings.Builder
	b.WriteString("nft: transaction rejected")
	if e.Op != "" {
		fmt.Fprintf(&b, " at message %d of %d, %s", e.Index, e.Count, e.Op)
	}
	b.WriteString(": ")
	b.WriteString(e.Errno.Error())
	if e.Text != "" {
		b.WriteString(" (" + e.Text + ")")
	}
	return b.String()
}

// Unwrap makes errors.Is(err, unix.ENOENT) and the like work.
func (e *RejectedError) Unwrap() error { return e.Errno }

// rejection reads an NLMSG_ERROR message's body (after its header, whose
// flags are flags) and returns the refused message's sequence number and
// the kernel's errno and text; errno 0 is an acknowledgement.
func rejection(flags uint16, body []byte) (seq uint32, errno unix.Errno, text string) {
	if len(body) < 4+nlmsgHdrLen {
		return 0, 0, ""
	}
	code := int32(binary.NativeEndian.Uint32(body))
	seq = binary.NativeEndian.Uint32(body[4+8:])
	if code >= 0 {
		return seq, 0, ""
	}
	errno = unix.Errno(-code)
	if flags&unix.NLM_F_ACK_TLVS != 0 {
		// The refused message is quoted whole unless the socket asked
		// for it capped; the attributes follow it.
		n := int(binary.NativeEndian.Uint32(body[4:]))
		if flags&unix.NLM_F_CAPPED != 0 {
			n = nlmsgHdrLen
		}
		if 4+nlmsgAlign(n) <= len(body) {
			a := newAttrs(body[4+nlmsgAlign(n):])
			for a.next() {
				if a.typ == unix.NLMSGERR_ATTR_MSG {
					text = a.str()
				}
			}
		}
	}
	return seq, errno, text
}

// messageNumbered returns the message of the batch numbered seq and its
// position among the batch's messages between begin and end (and their
// count), or nil.
func messageNumbered(batch [][]byte, seq uint32) (msg []byte, index, count int) {
	i := 0
	for _, chunk := range batch {
		for p := 0; p+nlmsgHdrLen <= len(chunk); {
			n := int(binary.NativeEndian.Uint32(chunk[p:]))
			if n < nlmsgHdrLen || p+n > len(chunk) {
				break
			}
			typ := binary.NativeEndian.Uint16(chunk[p+4:])
			if typ != unix.NFNL_MSG_BATCH_BEGIN && typ != unix.NFNL_MSG_BATCH_END {
				i++
				if binary.NativeEndian.Uint32(chunk[p+8:]) == seq {
					msg, index = chunk[p:p+n], i
				}
			}
			p += nlmsgAlign(n)
		}
	}
	return msg, index, i
}

// messageKinds say, for each nf_tables message type a transaction sends,
// what it does in nft's words (for element lists, with the count and
// noun to fill in) and which attribute names its object (0: the table
// itself).
var messageKinds = map[uint16]struct {
	verb     string
	nameAttr uint16
}{
	unix.NFT_MSG_NEWTABLE:   {"add table", 0},
	unix.NFT_MSG_DELTABLE:   {"delete table", 0},
	unix.NFT_MSG_NEWCHAIN:   {"add chain", unix.NFTA_CHAIN_NAME},
	unix.NFT_MSG_DELCHAIN:   {"delete chain", unix.NFTA_CHAIN_NAME},
	unix.NFT_MSG_NEWRULE:    {"add rule to chain", unix.NFTA_RULE_CHAIN},
	unix.NFT_MSG_DELRULE:    {"delete rule in chain", unix.NFTA_RULE_CHAIN},
	unix.NFT_MSG_NEWSET:     {"add set", unix.NFTA_SET_NAME},
	unix.NFT_MSG_DELSET:     {"delete set", unix.NFTA_SET_NAME},
	unix.NFT_MSG_NEWSETELEM: {"add %d %s to set", unix.NFTA_SET_ELEM_LIST_SET},
	unix.NFT_MSG_DELSETELEM: {"delete %d %s from set", unix.NFTA_SET_ELEM_LIST_SET},
	unix.NFT_MSG_NEWOBJ:     {"add object", unix.NFTA_OBJ_NAME},
	unix.NFT_MSG_DELOBJ:     {"delete object", unix.NFTA_OBJ_NAME},
}

// describeMessage says what one nf_tables message of a batch does, in
// nft's words: "add rule to chain ip proxyshift services (expressions:
// meta, cmp, fib)", "add 3 elements to set ip proxyshift
// service-endpoints-0", "delete chain ip proxyshift c1".
func describeMessage(msg []byte) string {
	if len(msg) < nlmsgHdrLen+4 {
		return "a malformed message"
	}
	typ := binary.NativeEndian.Uint16(msg[4:]) & 0xff
	kind, ok := messageKinds[typ]
	if !ok {
		return fmt.Sprintf("message type %d", typ)
	}
	rule := typ == unix.NFT_MSG_NEWRULE || typ == unix.NFT_MSG_DELRULE
	elems := typ == unix.NFT_MSG_NEWSETELEM || typ == unix.NFT_MSG_DELSETELEM
	table, name := "", ""
	var exprs []string
	elements := 0
	for a := newAttrs(msg[nlmsgHdrLen+4:]); a.next(); {
		switch {
		case a.typ == unix.NFTA_TABLE_NAME: // attribute 1 in every message
			table = a.str()
		case kind.nameAttr != 0 && a.typ == kind.nameAttr:
			name = a.str()
		case rule && a.typ == unix.NFTA_RULE_EXPRESSIONS:
			exprs = expressionNames(a.nested())
		case elems && a.typ == unix.NFTA_SET_ELEM_LIST_ELEMENTS:
			elements = countElements(a.nested())
		}
	}
	verb := kind.verb
	if elems {
		noun := "elements"
		if elements == 1 {
			noun = "element"
		}
		verb = fmt.Sprintf(verb, elements, noun)
	}
	family := familyName(nftables.TableFamily(msg[nlmsgHdrLen]))
	s := verb + " " + strings.TrimSpace(family+" "+table+" "+name)
	if len(exprs) > 0 {
		s += " (expressions: " + strings.Join(exprs, ", ") + ")"
	}
	return s
}

// countElements counts the elements of an element list as nft lists
// them: an interval's end, sent as an element of its own flagged
// NFT_SET_ELEM_INTERVAL_END, is part of its interval.
func countElements(list attrs) int {
	n := 0
	for list.next() {
		end := false
		for e := list.nested(); e.next(); {
			end = end || e.typ == unix.NFTA_SET_ELEM_FLAGS && e.be32()&unix.NFT_SET_ELEM_INTERVAL_END != 0
		}
		if !end {
			n++
		}
	}
	return n
}

// expressionNames lists the names of a rule's expressions (their
// NFTA_EXPR_NAME), in order.
func expressionNames(list attrs) []string {
	var names []string
	for list.next() {
		for e := list.nested(); e.next(); {
			if e.typ == unix.NFTA_EXPR_NAME {
				names = append(names, e.str())
			}
		}
	}
	return names
}

// familyName is nft's name of an nf_tables family.
func familyName(t nftables.TableFamily) string {
	for _, f := range Families {
		if f.Table == t {
			return f.Name
		}
	}
	return fmt.Sprintf("family %d", t)
}
