package ipvs

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	gnft "github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/proxyshift/proxyshift/nodeagent/dataplane"
	"github.com/proxyshift/proxyshift/test/netlab"
	"github.com/proxyshift/proxyshift/test/vm"
)

// TestVMCleanupHandsConnectionsOver checks that connections IPVS
// forwarded outlive Cleanup: established through a cluster IP and a
// NodePort (both masqueraded, the client is outside the cluster CIDRs),
// they keep exchanging data after Cleanup deleted every object of the
// backend, with no service rule of any mode left: their translation is
// conntrack's now. The kernel tracks connections and applies NAT entries
// only in namespaces where some rule uses conntrack and some nat-type
// chain exists (it registers those hooks with the first user); every
// mode a node switches to has both, and so does this test's stand-in
// for it, nat chains with one rule matching on conntrack state. A new
// connection to the service then finds nothing.
func TestVMCleanupHandsConnectionsOver(t *testing.T) {
	lab, pods := newLab(t, 2)
	b := newLabBackend(t, lab)
	sp := labService("web", "198.19.0.70", pods...)
	sp.NodePort = 30070
	mustSync(t, b, dataplane.SyncRequest{Model: snapshotOf(sp), Full: true})

	var sessions []*netlab.Session
	for _, target := range []netip.AddrPort{vip("198.19.0.70"), netip.AddrPortFrom(netlab.NodeIP, 30070)} {
		for range 2 {
			s, err := lab.Client.NS.OpenSession(target, okTimeout)
			if err != nil {
				t.Fatalf("connect to %s: %v", target, err)
			}
			defer s.Close()
			sessions = append(sessions, s)
		}
	}
	natHooks(t, lab)
	removed, err := b.Cleanup(context.Background())
	if err != nil {
		t.Fatalf("cleanup: %v", err)
	}
	t.Logf("cleanup removed %q", removed)
	if !strings.Contains(strings.Join(removed, "\n"), fmt.Sprintf("%d of %d connections", len(sessions), len(sessions))) {
		t.Errorf("cleanup removed %q; want every one of the %d connections handed over", removed, len(sessions))
	}
	if got := dumpIPVS(t, rawHandle(t, lab)); got != "" {
		t.Errorf("after cleanup the kernel holds\n%s", got)
	}
	for i, s := range sessions {
		for j := range 3 {
			if err := s.Exchange(fmt.Sprintf("after-cleanup-%d", j), okTimeout); err != nil {
				t.Errorf("connection %d (to %s) after cleanup: %v", i, s.Server, err)
				break
			}
		}
	}
	if _, err := lab.Client.NS.Request(netlab.TCP, vip("198.19.0.70"), okTimeout); err == nil {
		t.Errorf("a new connection to the cluster IP was answered after cleanup")
	}
}

// TestVMCleanupLeavesTheNextModesConnectionsAlone checks that the
// handover takes only the connections IPVS forwarded. A connection the
// mode now serving made (its DNAT in prerouting comes before IPVS's hook)
// looks like one of IPVS's in conntrack, to the service and answered by
// an endpoint, but conntrack translates it already: held for the
// handover, its packets were dropped for the 3 s the handover waited for
// IPVS to expire an entry IPVS never had.
func TestVMCleanupLeavesTheNextModesConnectionsAlone(t *testing.T) {
	lab, pods := newLab(t, 2)
	b := newLabBackend(t, lab)
	service := vip("198.19.0.71")
	mustSync(t, b, dataplane.SyncRequest{Model: snapshotOf(labService("web", service.Addr().String(), pods...)), Full: true})
	natHooks(t, lab)

	viaIPVS, err := lab.Client.NS.OpenSession(service, okTimeout)
	if err != nil {
		t.Fatalf("connect through IPVS: %v", err)
	}
	defer viaIPVS.Close()
	nextModeDNAT(t, lab, service, netip.AddrPortFrom(pods[1].IP, netlab.ServerPort))
	viaNext, err := lab.Client.NS.OpenSession(service, okTimeout)
	if err != nil {
		t.Fatalf("connect through the next mode's DNAT: %v", err)
	}
	defer viaNext.Close()
	if viaNext.Server != pods[1].Name {
		t.Fatalf("the connection after the next mode's DNAT was answered by %s, want %s", viaNext.Server, pods[1].Name)
	}

	removed, err := b.Cleanup(context.Background())
	if err != nil {
		t.Fatalf("cleanup: %v", err)
	}
	t.Logf("cleanup removed %q", removed)
	if !strings.Contains(strings.Join(removed, "\n"), "IPVS's translation of 1 of 1 connections") {
		t.Errorf("cleanup removed %q; want the one connection IPVS forwarded handed over, and only it", removed)
	}
	for name, s := range map[string]*netlab.Session{"through IPVS": viaIPVS, "through the next mode": viaNext} {
		if err := s.Exchange("after-cleanup", okTimeout); err != nil {
			t.Errorf("the connection %s (to %s) after cleanup: %v", name, s.Server, err)
		}
	}
}

// natHooks creates, in the lab node, a table with nat chains at
// prerouting, output and postrouting, one holding a rule on conntrack
// state that does nothing: the conntrack and NAT hooks any mode the node
// switches to registers, which make the kernel track connections and
// translate them by conntrack's NAT entries.
func natHooks(t *testing.T, lab *netlab.Lab) {
	t.Helper()
	c, err := gnft.New(gnft.WithNetNSFd(lab.Node.NS.FD()))
	if err != nil {
		t.Fatal(err)
	}
	tb := c.AddTable(&gnft.Table{Family: gnft.TableFamilyIPv4, Name: "next-mode"})
	var pre *gnft.Chain
	for name, hook := range map[string]*gnft.ChainHook{"prerouting": gnft.ChainHookPrerouting, "output": gnft.ChainHookOutput, "postrouting": gnft.ChainHookPostrouting} {
		ch := c.AddChain(&gnft.Chain{Name: name, Table: tb, Type: gnft.ChainTypeNAT, Hooknum: hook, Priority: gnft.ChainPriorityNATDest})
		if name == "prerouting" {
			pre = ch
		}
	}
	// ct state invalid counter
	c.AddRule(&gnft.Rule{Table: tb, Chain: pre, Exprs: []expr.Any{
		&expr.Ct{Key: expr.CtKeySTATE, Register: 1},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitINVALID), Xor: []byte{0, 0, 0, 0}},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte{0, 0, 0, 0}},
		&expr.Counter{},
	}})
	if err := c.Flush(); err != nil {
		t.Fatalf("create the nat chains: %v", err)
	}
}

// nextModeDNAT adds to natHooks' prerouting chain the translation of
// service (TCP) to endpoint, as the mode a node switches to has it.
func nextModeDNAT(t *testing.T, lab *netlab.Lab, service, endpoint netip.AddrPort) {
	t.Helper()
	vm.LoadModules(t, "nft_nat")
	c, err := gnft.New(gnft.WithNetNSFd(lab.Node.NS.FD()))
	if err != nil {
		t.Fatal(err)
	}
	tb := &gnft.Table{Family: gnft.TableFamilyIPv4, Name: "next-mode"}
	port := func(p uint16) []byte { return binaryutil.BigEndian.PutUint16(p) }
	// ip daddr service tcp dport port dnat to endpoint
	c.AddRule(&gnft.Rule{Table: tb, Chain: &gnft.Chain{Name: "prerouting", Table: tb}, Exprs: []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: service.Addr().AsSlice()},
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: port(service.Port())},
		&expr.Immediate{Register: 1, Data: endpoint.Addr().AsSlice()},
		&expr.Immediate{Register: 2, Data: port(endpoint.Port())},
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1, RegProtoMin: 2},
	}})
	if err := c.Flush(); err != nil {
		t.Fatalf("add the next mode's DNAT: %v", err)
	}
}
