package nftables

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/nftables"

	"github.com/proxyshift/proxyshift/nodeagent/dataplane/internal/nft"
	"github.com/proxyshift/proxyshift/nodeagent/model"
)

// ruleset is the rendered description of one table of a family: the
// objects the table always has, plus each service port's objects in it.
// It is what a sync programs and what the backend remembers having
// programmed.
type ruleset struct {
	f *family
	// name is the table's name.
	name string
	// chains and sets are the fixed objects. The shared maps among the
	// sets hold no elements here: those belong to the service ports.
	chains []*chain
	sets   []*set
	ports  map[model.ServicePortName]*portObjects
	// counted counts, for each element of the counted sets (by set, then
	// by text), the service ports that hold it. An element is in the
	// kernel exactly while its count is above zero. Only the main table
	// has counted sets.
	counted countedElems
	// contested says a port lost a key of a shared map to another port
	// (two services with one external IP and port): the key goes to the
	// next claimant only when the whole table is rendered again, so a
	// periodic resync rewrites the table rather than only verifying it.
	contested bool
}

// tables are the rulesets of a family's tables: the main table first,
// then the service tables in order (the port whose names say table i is
// in tables[1+i]).
type tables []*ruleset

// main is the main table.
func (ts tables) main() *ruleset { return ts[0] }

// service is service table i.
func (ts tables) service(i int) *ruleset { return ts[1+i] }

// written lets go of the expressions of rs's rules, and their anonymous
// maps, once a transaction that wrote them committed. What the backend keeps of a sync is what it
// compares: a rule by its text (an incremental sync, the periodic
// resync's chains by their rules' count), never to write it again (every
// sync writes rules it renders anew). At 10 000 service ports the
// expressions held 3 MB of the agent's heap for as long as it ran.
func (rs *ruleset) written() {
	dropExprs(rs.chains)
	for _, objs := range rs.ports {
		objs.written()
	}
}

// written is ruleset.written for one port's objects.
func (objs *portObjects) written() { dropExprs(objs.chains) }

func dropExprs(chains []*chain) {
	for _, c := range chains {
		for i := range c.Rules {
			c.Rules[i].Exprs, c.Rules[i].Anon = nil, nil
		}
	}
}

// refCounts counts holders of set elements, by element text.
type refCounts map[string]int

// add adds d to the count of each of elems, forgetting those that reach
// zero.
func (rc refCounts) add(elems []element, d int) {
	for _, e := range elems {
		rc.addKey(e.keyText(), d)
	}
}

// addKey adds d to the count of key, forgetting it if it reaches zero.
func (rc refCounts) addKey(key string, d int) {
	if rc[key] += d; rc[key] <= 0 {
		delete(rc, key)
	}
}

// countedSets are the sets whose elements several service ports may
// hold at once, each element once in the kernel: the cluster IPs (every
// port of a service has its service's), and the hairpin pairs (ports
// with an endpoint in common have its pair).
var countedSets = []string{setClusterIPs, setHairpin}

// countedElems are refCounts for each of the counted sets, by set name.
type countedElems map[string]refCounts

// newCountedElems returns counts of no element.
func newCountedElems() countedElems {
	c := countedElems{}
	for _, name := range countedSets {
		c[name] = refCounts{}
	}
	return c
}

// add adds d to the count of each of objs' counted elements.
func (c countedElems) add(objs *portObjects, d int) {
	for _, sh := range objs.counted {
		c[sh.set].add(sh.elems, d)
	}
}

// len is the number of counted elements in the kernel, all sets
// together.
func (c countedElems) len() int {
	n := 0
	for _, rc := range c {
		n += len(rc)
	}
	return n
}

// portObjects are the objects one service port owns: all of them as
// renderPort describes them, or those in one of its two tables (split).
type portObjects struct {
	chains []*chain
	// sets are the port's own sets and maps, with ClientIP affinity: the
	// numgen maps of its endpoint-choosing chains and the affinity sets
	// of its endpoints.
	sets []*set
	// shared holds the port's elements in the shared maps.
	shared sharedIn
	// anonElems is the number of elements of the anonymous maps its
	// rules DNAT with (Rules counts them, as a read-back does).
	anonElems int
	// counted are the port's elements of the counted sets (countedSets):
	// its cluster IP, and one "ep . ep" hairpin pair per distinct endpoint
	// address on this node. Several ports share elements: the ruleset
	// counts how many ports hold each (see ruleset.counted).
	counted sharedIn
	// endpoints is the number of endpoints the port's rules choose
	// among: the sum of its endpoint-choosing rules' (see counts).
	endpoints int
	// table is the port's service table (servicePortNames.table).
	table int
	// countsPort says these objects count the port in Counts.Services: of
	// the two parts of a port (in the main table and in its service
	// table), the one that holds elements of shared maps, the service
	// table's if both do.
	countsPort bool
}

// sharedElems are a port's elements in one shared map.
type sharedElems struct {
	set   string
	elems []element
}

// sharedIn are a port's elements in each shared map it has elements in,
// in the order it first named them. A list, not a map by name: a port
// has elements in one to three of them, and a Go map for each of 10 000
// ports held 3 to 4 MB of the agent's heap.
type sharedIn []sharedElems

// of are the elements in set, nil when there are none.
func (s sharedIn) of(set string) []element {
	for _, sh := range s {
		if sh.set == set {
			return sh.elems
		}
	}
	return nil
}

// add appends e to the elements in set.
func (s *sharedIn) add(set string, e element) {
	for i := range *s {
		if (*s)[i].set == set {
			(*s)[i].elems = append((*s)[i].elems, e)
			return
		}
	}
	*s = append(*s, sharedElems{set: set, elems: []element{e}})
}

// sets are the names of the maps s has elements in, sorted.
func (s sharedIn) sets() []string {
	names := make([]string, len(s))
	for i, sh := range s {
		names[i] = sh.set
	}
	slices.Sort(names)
	return names
}

// set is a named set or verdict map.
type set struct {
	name string
	// keyType is the key's type; keyText the same in nft's syntax.
	keyType nftables.SetDatatype
	keyText string
	// verdictMap maps keys to verdicts.
	verdictMap bool
	// dataType, when dataText is not empty, makes the set a data map
	// whose elements carry a value of that type (element.data);
	// dataText is the type in nft's syntax.
	dataType nftables.SetDatatype
	dataText string
	// interval sets hold prefixes, or ranges of integers.
	interval bool
	// numgenKey, when not zero, says the keys are numgen results, which
	// nft is told (typeof "numgen random mod numgenKey").
	numgenKey uint32
	// timeout > 0 makes a set the packet path fills itself (affinity): its
	// elements are never written by a sync.
	timeout time.Duration
	elems   []element
}

// dynamic says the kernel, not the sync, writes the set's elements.
func (s *set) dynamic() bool { return s.timeout > 0 }

// dataMap says the set maps keys to data (not verdicts).
func (s *set) dataMap() bool { return s.dataText != "" }

// isMap says the set is a map of either kind.
func (s *set) isMap() bool { return s.verdictMap || s.dataMap() }

// sameDefinition says whether a set found in the kernel can be kept for
// s: same kind, same flags and, where the library reports it reliably,
// same key length and timeout.
func (s *set) sameDefinition(k *nftables.Set) bool {
	if k.IsMap != s.isMap() || k.Interval != s.interval || k.HasTimeout != s.dynamic() ||
		k.Concatenation != s.concat() {
		return false
	}
	if s.dynamic() && k.Timeout != s.timeout {
		return false
	}
	// google/nftables overwrites the key type of a verdict map with the
	// data type when it parses one, so a verdict map's key does not
	// compare; a data map's key and data do.
	switch {
	case s.verdictMap:
		return !kernelDataMap(k)
	case s.dataMap():
		return kernelDataMap(k) && k.KeyType.Bytes == s.keyType.Bytes && k.DataType.Bytes == s.dataType.Bytes
	}
	return k.KeyType.Bytes == s.keyType.Bytes
}

// hasUserdata says whether a set found in the kernel with user data ud
// carries what a set made for s would (nft.Set.HasUserdata): a full sync
// creates anew the maps an earlier agent made without nft's description.
func (s *set) hasUserdata(ud []byte) bool {
	d := s.def()
	return d.HasUserdata(ud)
}

// kernelDataMap says whether a set the kernel listed is a data map: the
// library names the data type of a data map, not of a verdict map.
func kernelDataMap(k *nftables.Set) bool {
	return k.IsMap && k.DataType.Name != "" && k.DataType.Name != nftables.TypeVerdict.Name
}

func (s *set) concat() bool { return strings.Contains(s.keyText, " . ") }

// element is one element of a set or map. A full sync renders about
// 150 000 of them at 10 000 services (100 000 endpoint elements) and the
// backend keeps them as its state until the next sync, so each is kept
// small: its bytes are one slice and its texts one string.
type element struct {
	// raw is the key, then, in interval sets, the last key of the range
	// (nft.Element says how the kernel gets it), then a data map's data:
	// keyLen and endLen bytes, and the rest.
	raw []byte
	// text is the element in nft's syntax but for its verdict and
	// comment: the key (its first keyTextLen bytes), then, in a data
	// map, " : " and the data.
	text    string
	verdict *nft.Verdict
	comment string
	keyLen  uint8
	endLen  uint8
	// keyTextLen is the length of the key's text in text.
	keyTextLen uint16
}

// newElement is the element of key, with the range's last key end (nil
// for none), data (nil for none) and their texts; the bytes are copied
// into one slice, and the texts into one string, only when there is more
// than a key.
func newElement(key, end, data []byte, keyText, dataText string) element {
	e := element{raw: key, text: keyText, keyLen: uint8(len(key)), endLen: uint8(len(end)), keyTextLen: uint16(len(keyText))}
	if len(end)+len(data) > 0 {
		e.raw = slices.Concat(key, end, data)
	}
	if dataText != "" {
		e.text = keyText + " : " + dataText
	}
	return e
}

// key is the element's key.
func (e *element) key() []byte { return e.raw[:e.keyLen:e.keyLen] }

// rangeEnd is the last key of the element's range; nil when it has none.
func (e *element) rangeEnd() []byte {
	if e.endLen == 0 {
		return nil
	}
	return e.raw[e.keyLen : e.keyLen+e.endLen : e.keyLen+e.endLen]
}

// data is a data map element's value; nil in other sets.
func (e *element) data() []byte {
	if d := e.raw[e.keyLen+e.endLen:]; len(d) > 0 {
		return d
	}
	return nil
}

// keyText is the element's key in nft's syntax: what tells it from the
// other elements of its set.
func (e *element) keyText() string { return e.text[:e.keyTextLen] }

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
	return slices.EqualFunc(a, b, func(x, y rule) bool { return x.Text == y.Text })
}

// Keys of the shared maps, in network byte order with each field padded
// to 32 bits as concatenations require.

func addrProtoPortKey(f *family, addr netip.Addr, proto byte, port int32) []byte {
	return append(f.Bytes(addr), protoPortKey(proto, port)...)
}

func protoPortKey(proto byte, port int32) []byte {
	return []byte{proto, 0, 0, 0, byte(port >> 8), byte(port), 0, 0}
}

// prefixElement is p as an interval-set element.
func prefixElement(f *family, p netip.Prefix) element {
	p = p.Masked()
	text := p.String()
	if p.IsSingleIP() {
		text = p.Addr().String()
	}
	return newElement(f.Bytes(p.Addr()), f.Bytes(nft.LastAddr(p)), nil, text, "")
}

func itoa(i int32) string { return strconv.Itoa(int(i)) }
