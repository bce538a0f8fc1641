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

// messageVerbs names the nf_tables message types a transaction sends.
var messageVerbs = map[uint16]string{
	unix.NFT_MSG_NEWTABLE:   "add table",
	unix.NFT_MSG_DELTABLE:   "delete table",
	unix.NFT_MSG_NEWCHAIN:   "add chain",
	unix.NFT_MSG_DELCHAIN:   "delete chain",
	unix.NFT_MSG_NEWRULE:    "add rule",
	unix.NFT_MSG_DELRULE:    "delete rule",
	unix.NFT_MSG_NEWSET:     "add set",
	unix.NFT_MSG_DELSET:     "delete set",
	unix.NFT_MSG_NEWSETELEM: "add",
	unix.NFT_MSG_DELSETELEM: "delete",
	unix.NFT_MSG_NEWOBJ:     "add object",
	unix.NFT_MSG_DELOBJ:     "delete object",
}

// Attribute numbers of the messages describeMessage reads
// (include/uapi/linux/netfilter/nf_tables.h): every message's table is
// attribute 1; a chain's name is 3, a rule's chain 2, a set's name 2, an
// element list's set 2.
const (
	attrTable        = unix.NFTA_TABLE_NAME
	attrChainName    = unix.NFTA_CHAIN_NAME
	attrRuleChain    = unix.NFTA_RULE_CHAIN
	attrRuleExprs    = unix.NFTA_RULE_EXPRESSIONS
	attrSetName      = unix.NFTA_SET_NAME
	attrElemListSet  = unix.NFTA_SET_ELEM_LIST_SET
	attrElemListElem = unix.NFTA_SET_ELEM_LIST_ELEMENTS
	attrExprName     = unix.NFTA_EXPR_NAME
)

// describeMessage says what one nf_tables message of a batch does, in
// nft's words: "add rule to chain ip proxyshift services (expressions:
// meta, cmp, fib)", "add 3 elements to set ip proxyshift
// service-endpoints-0", "delete chain ip proxyshift c1".
func describeMessage(msg []byte) string {
	if len(msg) < nlmsgHdrLen+4 {
		return "a malformed message"
	}
	typ := binary.NativeEndian.Uint16(msg[4:]) & 0xff
	family := familyName(nftables.TableFamily(msg[nlmsgHdrLen]))
	verb, ok := messageVerbs[typ]
	if !ok {
		return fmt.Sprintf("message type %d", typ)
	}
	var table, name string
	var exprs []string
	elements := 0
	a := newAttrs(msg[nlmsgHdrLen+4:])
	for a.next() {
		switch {
		case a.typ == attrTable:
			table = a.str()
		case typ == unix.NFT_MSG_NEWCHAIN || typ == unix.NFT_MSG_DELCHAIN:
			if a.typ == attrChainName {
				name = a.str()
			}
		case typ == unix.NFT_MSG_NEWRULE || typ == unix.NFT_MSG_DELRULE:
			if a.typ == attrRuleChain {
				name = a.str()
			}
			if a.typ == attrRuleExprs {
				exprs = expressionNames(a.nested())
			}
		case typ == unix.NFT_MSG_NEWSET || typ == unix.NFT_MSG_DELSET:
			if a.typ == attrSetName {
				name = a.str()
			}
		case typ == unix.NFT_MSG_NEWSETELEM || typ == unix.NFT_MSG_DELSETELEM:
			if a.typ == attrElemListSet {
				name = a.str()
			}
			if a.typ == attrElemListElem {
				elements = countElements(a.nested())
			}
		}
	}
	object := strings.TrimSpace(family + " " + table + " " + name)
	switch typ {
	case unix.NFT_MSG_NEWTABLE, unix.NFT_MSG_DELTABLE:
		return verb + " " + object
	case unix.NFT_MSG_NEWRULE, unix.NFT_MSG_DELRULE:
		s := verb + " in chain " + object
		if typ == unix.NFT_MSG_NEWRULE {
			s = verb + " to chain " + object
		}
		if len(exprs) > 0 {
			s += " (expressions: " + strings.Join(exprs, ", ") + ")"
		}
		return s
	case unix.NFT_MSG_NEWSETELEM, unix.NFT_MSG_DELSETELEM:
		noun := "elements"
		if elements == 1 {
			noun = "element"
		}
		prep := "to"
		if typ == unix.NFT_MSG_DELSETELEM {
			prep = "from"
		}
		return fmt.Sprintf("%s %d %s %s set %s", verb, elements, noun, prep, object)
	}
	return verb + " " + object
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
			if e.typ == attrExprName {
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
