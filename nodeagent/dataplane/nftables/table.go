package nftables

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/proxyshift/proxyshift/nodeagent/model"
)

// ruleset is the rendered description of one family's table: the objects
// every table has, plus each service port's own objects. It is what a
// sync programs and what the backend remembers having programmed.
type ruleset struct {
	f *family
	// chains and sets are the fixed objects. The shared maps among the
	// sets hold no elements here: those belong to the service ports.
	chains []*chain
	sets   []*set
	ports  map[model.ServicePortName]*portObjects
}

// portObjects are the objects one service port owns.
type portObjects struct {
	chains []*chain
	// sets are the port's own sets and maps: the numgen maps of its
	// endpoint-choosing chains and the affinity sets of its endpoints.
	sets []*set
	// shared holds the port's elements in the shared maps, by map name.
	shared map[string][]element
	// endpoints is the number of endpoint chains.
	endpoints int
}

// chain is a chain and its rules; hook is nil for a regular chain.
type chain struct {
	name  string
	hook  *hook
	rules []rule
}

// hook is where a base chain is attached.
type hook struct {
	typ      nftables.ChainType
	hookName string
	num      nftables.ChainHook
	priority nftables.ChainPriority
}

// set is a named set or verdict map.
type set struct {
	name string
	// keyType is the key's type; keyText the same in nft's syntax.
	keyType nftables.SetDatatype
	keyText string
	// verdictMap maps keys to verdicts.
	verdictMap bool
	// interval sets hold prefixes.
	interval bool
	// hostOrderKey keys (numgen results) are in host byte order.
	hostOrderKey bool
	// timeout > 0 makes a set the packet path fills itself (affinity): its
	// elements are never written by a sync.
	timeout time.Duration
	elems   []element
}

// dynamic says the kernel, not the sync, writes the set's elements.
func (s *set) dynamic() bool { return s.timeout > 0 }

// sameDefinition says whether a set found in the kernel can be kept for
// s: same kind, same flags and, where the library reports it reliably,
// same key length and timeout.
func (s *set) sameDefinition(k *nftables.Set) bool {
	if k.IsMap != s.verdictMap || k.Interval != s.interval || k.HasTimeout != s.dynamic() ||
		k.Concatenation != s.concat() {
		return false
	}
	if s.dynamic() && k.Timeout != s.timeout {
		return false
	}
	// google/nftables overwrites the key type of a verdict map with the
	// data type when it parses one, so only plain sets' keys compare.
	return s.verdictMap || k.KeyType.Bytes == s.keyType.Bytes
}

func (s *set) concat() bool { return strings.Contains(s.keyText, " . ") }

// element is one element of a set or map.
type element struct {
	key []byte
	// keyEnd, in interval sets, is the first address after the prefix,
	// nil when the prefix runs to the end of the address space.
	keyEnd []byte
	// text is the key in nft's syntax.
	text    string
	verdict *verdict
	comment string
}

// verdict is the value of a verdict-map element.
type verdict struct {
	kind  expr.VerdictKind
	chain string
}

func (v *verdict) String() string {
	switch v.kind {
	case expr.VerdictGoto:
		return "goto " + v.chain
	case expr.VerdictJump:
		return "jump " + v.chain
	default:
		return "drop"
	}
}

func gotoChain(c string) *verdict { return &verdict{kind: expr.VerdictGoto, chain: c} }

var verdictDrop = &verdict{kind: expr.VerdictDrop}

// String renders the element as nft writes it inside "elements = { }".
func (e element) String() string {
	s := e.text
	if e.verdict != nil {
		s += " : " + e.verdict.String()
	}
	if e.comment != "" {
		s += fmt.Sprintf(" comment %q", e.comment)
	}
	return s
}

// elementsEqual compares element lists by their text, which covers key,
// verdict and comment.
func elementsEqual(a, b []element) bool {
	return slices.EqualFunc(a, b, func(x, y element) bool { return x.String() == y.String() })
}

// rulesEqual compares rule lists by their text.
func rulesEqual(a, b []rule) bool {
	return slices.EqualFunc(a, b, func(x, y rule) bool { return x.text == y.text })
}

// Keys of the shared maps, in network byte order with each field padded
// to 32 bits as concatenations require.

func addrProtoPortKey(f *family, addr netip.Addr, proto byte, port int32) []byte {
	return append(f.bytes(addr), protoPortKey(proto, port)...)
}

func protoPortKey(proto byte, port int32) []byte {
	return []byte{proto, 0, 0, 0, byte(port >> 8), byte(port), 0, 0}
}

// prefixElement is p as an interval-set element.
func prefixElement(f *family, p netip.Prefix) element {
	p = p.Masked()
	e := element{key: f.bytes(p.Addr()), text: p.String()}
	if p.IsSingleIP() {
		e.text = p.Addr().String()
	}
	// The first address after the prefix: the last one, plus one.
	last := f.bytes(p.Addr())
	for i := p.Bits(); i < len(last)*8; i++ {
		last[i/8] |= 0x80 >> (i % 8)
	}
	for i := len(last) - 1; i >= 0; i-- {
		last[i]++
		if last[i] != 0 {
			e.keyEnd = last
			break
		}
	}
	return e
}

func itoa(i int32) string { return strconv.Itoa(int(i)) }
