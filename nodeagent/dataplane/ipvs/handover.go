package ipvs

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/proxyshift/proxyshift/nodeagent/dataplane/internal/nft"
)

// Connections IPVS forwarded outlive the backend's Cleanup (a switch away
// from ipvs) by being handed over to conntrack's NAT, which the other
// modes use: see "Leaving IPVS" in the README.
//
// IPVS rewrites a connection's destination itself and, with
// net.ipv4.vs.conntrack=1, only alters its conntrack entry's reply tuple,
// without NAT status: once the virtual service is gone nothing would
// translate the connection's packets. Worse, when IPVS expires its own
// connection entry (at once, for a deleted real server, with
// expire_nodest_conn=1), it deletes the conntrack entry of the same
// original tuple. So the handover reads the entries before the virtual
// services go, waits for IPVS to delete them, and creates each again over
// ctnetlink with a DNAT binding to the real server IPVS chose (and an
// SNAT binding to the address masquerading gave it, if any): the same
// translation, now conntrack's.
//
// Between IPVS deleting an entry and the handover creating it again, a
// packet of the connection would make conntrack start a new entry, which
// the mode now serving would NAT as a new connection, to any endpoint and
// another masquerading port: the endpoint would answer with a reset. So
// the packets of the flows (both directions) are dropped before
// conntrack sees them from before the virtual services go until the
// helper table goes, a second or less; TCP sends them again.

// forwardedFlow is a connection IPVS forwarded to a real server, as its
// conntrack entry shows it.
type forwardedFlow struct {
	proto uint8
	// client and service are the original source and destination; the
	// service is one of the backend's virtual services.
	client, service netip.AddrPort
	// endpoint is the real server IPVS chose: the reply's source.
	endpoint netip.AddrPort
	// replyTo is the reply's destination: the client itself, or the
	// address and port masquerading gave the connection.
	replyTo netip.AddrPort
	// tcpState is the conntrack TCP state (TCP only).
	tcpState uint8
	mark     uint32
	// timeout is the entry's remaining lifetime, in seconds.
	timeout uint32
}

func (fl forwardedFlow) String() string {
	return fmt.Sprintf("%s %s -> %s via %s", nft.ProtoName(fl.proto), fl.client, fl.service, fl.endpoint)
}

func addrPort(ip []byte, port uint16) netip.AddrPort {
	a, _ := netip.AddrFromSlice(ip)
	return netip.AddrPortFrom(a.Unmap(), port)
}

// forwardedFlows picks, from a conntrack dump, the TCP and UDP entries of
// connections IPVS forwarded for one of the virtual services in ours: the
// original destination is the virtual service and the reply comes from
// elsewhere (conntrack's own DNAT never happens for those, IPVS altered
// the reply tuple). TCP connections that have ended (TIME_WAIT, CLOSE)
// are left out, and so is SCTP: its entries carry an association state
// ctnetlink cannot set whole.
func forwardedFlows(dump []*netlink.ConntrackFlow, ours map[vsKey]bool) []forwardedFlow {
	var out []forwardedFlow
	for _, c := range dump {
		if c.Forward.Protocol != unix.IPPROTO_TCP && c.Forward.Protocol != unix.IPPROTO_UDP {
			continue
		}
		fl := forwardedFlow{
			proto:    c.Forward.Protocol,
			client:   addrPort(c.Forward.SrcIP, c.Forward.SrcPort),
			service:  addrPort(c.Forward.DstIP, c.Forward.DstPort),
			endpoint: addrPort(c.Reverse.SrcIP, c.Reverse.SrcPort),
			replyTo:  addrPort(c.Reverse.DstIP, c.Reverse.DstPort),
			mark:     c.Mark,
			timeout:  c.TimeOut,
		}
		if !ours[vsKey{addr: fl.service.Addr(), proto: fl.proto, port: fl.service.Port()}] || fl.endpoint == fl.service {
			continue
		}
		if tcp, ok := c.ProtoInfo.(*netlink.ProtoInfoTCP); ok {
			fl.tcpState = tcp.State
		}
		if fl.proto == unix.IPPROTO_TCP && (fl.tcpState == tcpTimeWait || fl.tcpState == tcpClose) {
			continue
		}
		out = append(out, fl)
	}
	return out
}

// The ctnetlink attributes the handover writes beyond those the netlink
// library names (include/uapi/linux/netfilter/nfnetlink_conntrack.h).
const (
	ctaNATSrc                       = 6
	ctaNATDst                       = 13
	ctaNATV4MinIP                   = 1
	ctaNATV4MaxIP                   = 2
	ctaNATProto                     = 3
	ctaNATV6MinIP                   = 4
	ctaNATV6MaxIP                   = 5
	ctaProtoNATPortMin              = 1
	ctaProtoNATPortMax              = 2
	ctaProtoInfoTCPFlagsOrig        = 4
	ctaProtoInfoTCPFlagsReply       = 5
	ipsSeenReply                    = 1 << 1
	ipsAssured                      = 1 << 2
	ipsConfirmed                    = 1 << 3
	ipsDstNAT                       = 1 << 5
	ipCTTCPFlagBeLiberal      uint8 = 0x08
	// minHandoverTimeout keeps a handed-over entry alive until the
	// connection's next packet refreshes it.
	minHandoverTimeout = 60
	// Conntrack's TCP states of ended connections.
	tcpTimeWait = 7
	tcpClose    = 8
)

func tupleAttr(kind int, proto uint8, src, dst netip.AddrPort) *nl.RtAttr {
	srcType, dstType := nl.CTA_IP_V4_SRC, nl.CTA_IP_V4_DST
	if src.Addr().Is6() {
		srcType, dstType = nl.CTA_IP_V6_SRC, nl.CTA_IP_V6_DST
	}
	t := nl.NewRtAttr(unix.NLA_F_NESTED|kind, nil)
	ip := t.AddRtAttr(unix.NLA_F_NESTED|nl.CTA_TUPLE_IP, nil)
	ip.AddRtAttr(srcType, src.Addr().AsSlice())
	ip.AddRtAttr(dstType, dst.Addr().AsSlice())
	p := t.AddRtAttr(unix.NLA_F_NESTED|nl.CTA_TUPLE_PROTO, nil)
	p.AddRtAttr(nl.CTA_PROTO_NUM, []byte{proto})
	p.AddRtAttr(nl.CTA_PROTO_SRC_PORT, nl.BEUint16Attr(src.Port()))
	p.AddRtAttr(nl.CTA_PROTO_DST_PORT, nl.BEUint16Attr(dst.Port()))
	return t
}

// natAttr binds a connection to exactly one address and port.
func natAttr(kind int, to netip.AddrPort) *nl.RtAttr {
	minType, maxType := ctaNATV4MinIP, ctaNATV4MaxIP
	if to.Addr().Is6() {
		minType, maxType = ctaNATV6MinIP, ctaNATV6MaxIP
	}
	n := nl.NewRtAttr(unix.NLA_F_NESTED|kind, nil)
	n.AddRtAttr(minType, to.Addr().AsSlice())
	n.AddRtAttr(maxType, to.Addr().AsSlice())
	p := n.AddRtAttr(unix.NLA_F_NESTED|ctaNATProto, nil)
	p.AddRtAttr(ctaProtoNATPortMin, nl.BEUint16Attr(to.Port()))
	p.AddRtAttr(ctaProtoNATPortMax, nl.BEUint16Attr(to.Port()))
	return n
}

// natEntry renders the conntrack entry that translates fl as IPVS did:
// the original tuple, its untranslated reply, a DNAT binding to the
// endpoint and, when the reply went to another address than the client,
// an SNAT binding to it; seen replied and assured, so that it is never
// taken for a new connection and NAT rules never run for it again
// (confirmed too: ctnetlink confirms the entry before it reads the
// status, and refuses a status that would undo that); TCP
// in its state, with window tracking relaxed (conntrack did not see the
// windows of a connection picked up here).
func natEntry(fl forwardedFlow) []*nl.RtAttr {
	attrs := []*nl.RtAttr{
		tupleAttr(nl.CTA_TUPLE_ORIG, fl.proto, fl.client, fl.service),
		tupleAttr(nl.CTA_TUPLE_REPLY, fl.proto, fl.service, fl.client),
		natAttr(ctaNATDst, fl.endpoint),
	}
	if fl.replyTo != fl.client {
		attrs = append(attrs, natAttr(ctaNATSrc, fl.replyTo))
	}
	attrs = append(attrs,
		nl.NewRtAttr(nl.CTA_STATUS, nl.BEUint32Attr(ipsSeenReply|ipsAssured|ipsConfirmed)),
		nl.NewRtAttr(nl.CTA_TIMEOUT, nl.BEUint32Attr(max(fl.timeout, minHandoverTimeout))),
		nl.NewRtAttr(nl.CTA_MARK, nl.BEUint32Attr(fl.mark)),
	)
	if fl.proto == unix.IPPROTO_TCP {
		info := nl.NewRtAttr(unix.NLA_F_NESTED|nl.CTA_PROTOINFO, nil)
		tcp := info.AddRtAttr(unix.NLA_F_NESTED|nl.CTA_PROTOINFO_TCP, nil)
		tcp.AddRtAttr(nl.CTA_PROTOINFO_TCP_STATE, []byte{fl.tcpState})
		liberal := []byte{ipCTTCPFlagBeLiberal, ipCTTCPFlagBeLiberal}
		tcp.AddRtAttr(ctaProtoInfoTCPFlagsOrig, liberal)
		tcp.AddRtAttr(ctaProtoInfoTCPFlagsReply, liberal)
		attrs = append(attrs, info)
	}
	return attrs
}

// forwarded lists the connections IPVS forwarded for the virtual services
// in ours. A busy table interrupts dumps; after a few tries the last,
// incomplete, dump is used (the connections it missed end at the switch,
// as they would without a handover).
//
// A connection to one of those services that the mode now serving made
// (its rules translate new connections before IPVS's hook sees them, from
// the moment they are in place) looks the same in the dump: original
// destination the service, reply from an endpoint. It is conntrack's
// already and must not be held or handed over: its packets would be
// dropped while the handover waits for IPVS to expire an entry IPVS never
// had, 3 s, enough for a client to give up on an answer. Its entry carries
// the status of conntrack's own destination NAT, which IPVS never sets; so
// each candidate's status is read before it is kept.
func (kn *kernel) forwarded(f *family, ours map[vsKey]bool) ([]forwardedFlow, error) {
	var own []forwardedFlow
	err := kn.netns.Do(func() error {
		var dump []*netlink.ConntrackFlow
		var err error
		for range 5 {
			dump, err = netlink.ConntrackTableList(netlink.ConntrackTable, netlink.InetFamily(f.af))
			if !errors.Is(err, netlink.ErrDumpInterrupted) {
				break
			}
		}
		if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
			return fmt.Errorf("ipvs: list conntrack entries: %w", err)
		}
		for _, fl := range forwardedFlows(dump, ours) {
			status, err := entryStatus(f, fl)
			switch {
			case errors.Is(err, unix.ENOENT): // ended since the dump
			case err != nil:
				return fmt.Errorf("ipvs: read the conntrack status of %s: %w", fl, err)
			case status&ipsDstNAT == 0:
				own = append(own, fl)
			}
		}
		return nil
	})
	return own, err
}

// entryStatus reads the status bits of fl's conntrack entry, from the
// calling thread's namespace.
func entryStatus(f *family, fl forwardedFlow) (uint32, error) {
	msgs, err := ctnetlink(f, nl.IPCTNL_MSG_CT_GET, 0, []*nl.RtAttr{tupleAttr(nl.CTA_TUPLE_ORIG, fl.proto, fl.client, fl.service)})
	if err != nil {
		return 0, err
	}
	for _, m := range msgs {
		if len(m) < nl.SizeofNfgenmsg {
			continue
		}
		attrs, err := nl.ParseRouteAttr(m[nl.SizeofNfgenmsg:])
		if err != nil {
			return 0, err
		}
		for _, a := range attrs {
			if a.Attr.Type&nl.NLA_TYPE_MASK == nl.CTA_STATUS && len(a.Value) == 4 {
				return binary.BigEndian.Uint32(a.Value), nil
			}
		}
	}
	return 0, fmt.Errorf("no status in the kernel's answer")
}

// ctnetlink sends one ctnetlink request of family f with attrs, from the
// calling thread's namespace, waits for its acknowledgement and returns
// the messages the kernel answered with.
func ctnetlink(f *family, msg, flags int, attrs []*nl.RtAttr) ([][]byte, error) {
	req := nl.NewNetlinkRequest((unix.NFNL_SUBSYS_CTNETLINK<<8)|msg, unix.NLM_F_ACK|flags)
	req.AddData(&nl.Nfgenmsg{NfgenFamily: uint8(f.af), Version: nl.NFNETLINK_V0})
	for _, a := range attrs {
		req.AddData(a)
	}
	return req.Execute(unix.NETLINK_NETFILTER, 0)
}

// handoverWait bounds how long the handover waits for IPVS to expire the
// connections of deleted virtual services (it does so at once on Linux
// 5.9 and later with expire_nodest_conn=1).
const handoverWait = 3 * time.Second

// handOver gives the flows, whose virtual services were just deleted,
// conntrack NAT entries of their own. It creates each as soon as IPVS has
// deleted the flow's entry (until then the kernel refuses the tuple,
// EEXIST), for handoverWait at most; an entry still there then is deleted
// here first (IPVS may delete the new one later: before Linux 5.9 it
// expires connections of deleted real servers only at their next packet
// or timeout). It returns how many flows were handed over.
func (kn *kernel) handOver(ctx context.Context, f *family, flows []forwardedFlow) (int, error) {
	done := 0
	var errs []error
	failed := func(fl forwardedFlow, err error) {
		errs = append(errs, fmt.Errorf("ipvs: hand connection %s over to conntrack: %w", fl, err))
	}
	err := kn.netns.Do(func() error {
		pending := flows
		deadline := time.Now().Add(handoverWait)
		for len(pending) > 0 && time.Now().Before(deadline) && ctx.Err() == nil {
			var wait []forwardedFlow
			for _, fl := range pending {
				switch _, err := ctnetlink(f, nl.IPCTNL_MSG_CT_NEW, unix.NLM_F_CREATE|unix.NLM_F_EXCL, natEntry(fl)); {
				case err == nil:
					done++
				case errors.Is(err, unix.EEXIST):
					wait = append(wait, fl)
				default:
					failed(fl, err)
				}
			}
			if pending = wait; len(pending) > 0 {
				time.Sleep(10 * time.Millisecond)
			}
		}
		if len(pending) > 0 {
			// Their packets have been dropped all this while; say why the
			// pause was this long.
			klog.InfoS("IPVS had not expired the connections of the deleted virtual services in time; deleting their conntrack entries to hand them over",
				"family", f.Name, "connections", len(pending), "of", len(flows), "waited", handoverWait)
		}
		for _, fl := range pending {
			orig := tupleAttr(nl.CTA_TUPLE_ORIG, fl.proto, fl.client, fl.service)
			if _, err := ctnetlink(f, nl.IPCTNL_MSG_CT_DELETE, 0, []*nl.RtAttr{orig}); err != nil && !errors.Is(err, unix.ENOENT) {
				failed(fl, err)
				continue
			}
			if _, err := ctnetlink(f, nl.IPCTNL_MSG_CT_NEW, unix.NLM_F_CREATE|unix.NLM_F_EXCL, natEntry(fl)); err != nil {
				failed(fl, err)
				continue
			}
			done++
		}
		return nil
	})
	return done, errors.Join(append(errs, err)...)
}

// handoverKey is a flow direction's key in setHandover: saddr . daddr .
// l4proto . sport . dport, each field padded to 32 bits.
func handoverKey(f *family, proto uint8, src, dst netip.AddrPort) []byte {
	k := append(f.Bytes(src.Addr()), f.Bytes(dst.Addr())...)
	k = append(k, proto, 0, 0, 0)
	k = append(k, byte(src.Port()>>8), byte(src.Port()), 0, 0)
	return append(k, byte(dst.Port()>>8), byte(dst.Port()), 0, 0)
}

// handoverElements are both directions of every flow: the client's
// packets to the service, the endpoint's replies to it or to the
// masquerading address.
func handoverElements(f *family, flows []forwardedFlow) []nftables.SetElement {
	var out []nftables.SetElement
	for _, fl := range flows {
		out = append(out,
			nftables.SetElement{Key: handoverKey(f, fl.proto, fl.client, fl.service)},
			nftables.SetElement{Key: handoverKey(f, fl.proto, fl.endpoint, fl.replyTo)})
	}
	return out
}

// blockFlows adds to the helper table of family f the set of the flows'
// packets and the chains that drop them at prerouting and output, at
// raw priority (before conntrack). Deleting the table ends it.
func (kn *kernel) blockFlows(f *family, flows []forwardedFlow) error {
	return kn.writeTable(func(txn *nft.Txn) error {
		c := txn.Conn()
		t := c.AddTable(tableRef(f))
		addr := f.AddrType
		set := &nftables.Set{Table: t, Name: setHandover, Concatenation: true,
			KeyType: nftables.MustConcatSetType(addr, addr, nftables.TypeInetProto, nftables.TypeInetService, nftables.TypeInetService)}
		if err := c.AddSet(set, handoverElements(f, flows)); err != nil {
			return fmt.Errorf("ipvs: queue set %s: %w", setHandover, err)
		}
		// Register after register: the two addresses, the protocol, the
		// ports.
		daddr := f.AfterAddr
		proto := daddr + (f.AfterAddr - unix.NFT_REG32_00)
		exprs := []expr.Any{
			&expr.Payload{DestRegister: unix.NFT_REG_1, Base: expr.PayloadBaseNetworkHeader, Offset: f.SaddrOffset, Len: f.AddrLen},
			&expr.Payload{DestRegister: daddr, Base: expr.PayloadBaseNetworkHeader, Offset: f.DaddrOffset, Len: f.AddrLen},
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: proto},
			&expr.Payload{DestRegister: proto + 1, Base: expr.PayloadBaseTransportHeader, Offset: 0, Len: 2},
			&expr.Payload{DestRegister: proto + 2, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
			&expr.Lookup{SourceRegister: unix.NFT_REG_1, SetName: set.Name, SetID: set.ID},
			&expr.Verdict{Kind: expr.VerdictDrop},
		}
		for name, hook := range map[string]*nftables.ChainHook{chainHandoverPrerouting: nftables.ChainHookPrerouting, chainHandoverOutput: nftables.ChainHookOutput} {
			ch := c.AddChain(&nftables.Chain{Name: name, Table: t, Type: nftables.ChainTypeFilter, Hooknum: hook, Priority: nftables.ChainPriorityRaw})
			c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: exprs})
		}
		return nil
	})
}
