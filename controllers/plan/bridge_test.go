package plan

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
	"github.com/proxyshift/proxyshift/controllers/kubeproxyconfig"
)

const kubeProxyConf = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nclusterCIDR: 198.18.64.0/18\nmode: \"\"\n"

// kubeProxyFound is kube-proxy's DaemonSet found, with conf in its
// ConfigMap kube-system/kube-proxy (key config.conf).
func kubeProxyFound(conf string) KubeProxy {
	return KubeProxy{DaemonSet: "kube-system/kube-proxy", Found: true, ConfigMap: "kube-system/kube-proxy:config.conf",
		Config: &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "kube-proxy", ResourceVersion: "1"},
			Data: map[string]string{"config.conf": conf}}}
}

// bridgeSim is a sim with kube-proxy in it: its DaemonSet, its pods (one
// on every node the handover lets it run on), its ConfigMap, and agents
// that report the mode kube-proxy's pod started in.
type bridgeSim struct {
	*sim
	// failHandBackInto makes an agent fail handing its node back while
	// kube-proxy's ConfigMap says this mode.
	failHandBackInto v1alpha1.ProxyMode
	// extraPods are nodes outside the sim that run kube-proxy.
	extraPods []string
	// handedBackEarly is set when a node was asked for kube-proxy while
	// the ConfigMap was half way (the bridge's invariant).
	configWrites int
	// handBackModes records, per hand-back write, the ConfigMap's mode.
	handBackModes []v1alpha1.ProxyMode
	// bridgeSpecs records every spec written for the bridge mode.
	bridgeSpecs []v1alpha1.ProxyNodeSpec
}

func newBridgeSim(t *testing.T, n int, to v1alpha1.ProxyMode, mut ...func(*v1alpha1.ProxyConfig)) *bridgeSim {
	mut = append([]func(*v1alpha1.ProxyConfig){func(c *v1alpha1.ProxyConfig) {
		c.Spec.KubeProxy = &v1alpha1.KubeProxyModeChange{Mode: to}
	}}, mut...)
	s := &bridgeSim{sim: newSim(t, n, v1alpha1.ModeKubeProxy, mut...)}
	for _, a := range s.agents {
		a.initial, a.kubeProxyMode = v1alpha1.ModeKubeProxy, v1alpha1.ModeIPTables
	}
	s.kubeProxy = kubeProxyFound(kubeProxyConf)
	s.kubeProxy.PodNodes = s.pods()
	return s
}

func (s *bridgeSim) configMode() v1alpha1.ProxyMode {
	c, err := kubeproxyconfig.Read(s.kubeProxy.Config, "config.conf")
	if err != nil {
		s.t.Fatal(err)
	}
	return c.Mode
}

// pods are where kube-proxy runs: every node that does not carry the
// handover's label, as the handover controller would have it.
func (s *bridgeSim) pods() map[string]bool {
	out := map[string]bool{}
	for _, n := range s.extraPods {
		out[n] = true
	}
	for _, n := range s.nodes {
		pn := s.pns[n.Name]
		if pn == nil || !pn.Spec.KubeProxyStopped {
			out[n.Name] = true
		}
	}
	return out
}

// world plays the handover controller and kube-proxy: a node whose agent
// serves a proxyshift mode loses its kube-proxy pod (and the agent then
// removes its rules); a node asked for kube-proxy gets a pod, which
// starts in the ConfigMap's mode.
func (s *bridgeSim) world() {
	for name, pn := range s.pns {
		st := &pn.Status
		switch {
		case pn.Spec.DesiredMode != "" && pn.Spec.DesiredMode != v1alpha1.ModeKubeProxy && st.ActiveMode == pn.Spec.DesiredMode:
			pn.Spec.KubeProxyStopped = true
			st.KubeProxyMode = ""
		case pn.Spec.DesiredMode == v1alpha1.ModeKubeProxy && pn.Spec.KubeProxyStopped:
			pn.Spec.KubeProxyStopped = false
		case st.ActiveMode == v1alpha1.ModeKubeProxy && !pn.Spec.KubeProxyStopped && st.KubeProxyMode == "":
			st.KubeProxyMode = s.configMode()
		}
		s.agents[name].failOn = map[v1alpha1.ProxyMode]bool{v1alpha1.ModeKubeProxy: s.failHandBackInto != "" && s.configMode() == s.failHandBackInto}
	}
	s.kubeProxy.PodNodes = s.pods()
}

// runBridge advances the world until done (nil: max steps, whatever
// happens), applying the planner's ConfigMap writes.
func (s *bridgeSim) runBridge(max int, done func() bool) {
	s.t.Helper()
	c := s.cfg("pc")
	for i := 0; i < max; i++ {
		s.step++
		s.runAgents()
		s.world()
		before := map[string]v1alpha1.ProxyMode{}
		for n, pn := range s.pns {
			before[n] = pn.Spec.DesiredMode
		}
		res := s.plan(c)
		if w := res.KubeProxyConfig; w != nil {
			if w.ResourceVersion != s.kubeProxy.Config.ResourceVersion {
				s.t.Fatalf("ConfigMap write from a stale copy")
			}
			s.kubeProxy.Config = w.DeepCopy()
			s.kubeProxy.Config.ResourceVersion += "1"
			s.configWrites++
		}
		for _, u := range res.Update {
			if u.Spec.DesiredMode != v1alpha1.ModeKubeProxy {
				s.bridgeSpecs = append(s.bridgeSpecs, *u.Spec.DeepCopy())
			}
			if u.Spec.DesiredMode == v1alpha1.ModeKubeProxy && before[u.Name] != v1alpha1.ModeKubeProxy {
				s.handBackModes = append(s.handBackModes, s.configMode())
				for _, n := range s.nodes {
					if pn := s.pns[n.Name]; n.Name != u.Name && pn.Status.ActiveMode == v1alpha1.ModeKubeProxy && pn.Status.KubeProxyMode != "" && pn.Status.KubeProxyMode != s.configMode() &&
						c.Status.KubeProxyBridge != nil && c.Status.KubeProxyBridge.Stage == v1alpha1.BridgeHandingBack {
						s.t.Fatalf("step %d: %s handed back while %s still runs kube-proxy %s", s.step, u.Name, n.Name, pn.Status.KubeProxyMode)
					}
				}
			}
		}
		if done != nil && done() {
			return
		}
		s.now = s.now.Add(s.tick)
	}
	if done == nil {
		return
	}
	s.t.Fatalf("not done after %d steps\n%s", max, s.dump())
}

func TestBridgeIPTablesToNFTables(t *testing.T) {
	s := newBridgeSim(t, 4, v1alpha1.ModeNFTables, maxU(intstr.FromInt32(2)))
	c := s.cfg("pc")
	s.runBridge(200, s.phaseIs("pc", v1alpha1.RolloutCompleted))
	if got := s.configMode(); got != v1alpha1.ModeNFTables {
		t.Errorf("ConfigMap mode %s, want nftables", got)
	}
	if s.configWrites != 1 {
		t.Errorf("%d ConfigMap writes, want 1", s.configWrites)
	}
	for _, m := range s.handBackModes {
		if m != v1alpha1.ModeNFTables {
			t.Errorf("a node was handed back while the ConfigMap said %s", m)
		}
	}
	for name, pn := range s.pns {
		if pn.Status.ActiveMode != v1alpha1.ModeKubeProxy || pn.Status.KubeProxyMode != v1alpha1.ModeNFTables {
			t.Errorf("%s: active %s, kube-proxy mode %s", name, pn.Status.ActiveMode, pn.Status.KubeProxyMode)
		}
		if pn.Spec.Settings.ClusterCIDRs != nil {
			t.Errorf("%s keeps bridge settings after the hand-back: %+v", name, pn.Spec.Settings)
		}
	}
	b := c.Status.KubeProxyBridge
	if b == nil || b.Stage != v1alpha1.BridgeCompleted || b.From != v1alpha1.ModeIPTables || b.To != v1alpha1.ModeNFTables || b.RollingBack {
		t.Errorf("bridge status %+v", b)
	}
	if r := s.cond("pc", v1alpha1.ConditionReady); r.Status != metav1.ConditionTrue || !strings.Contains(r.Message, "kube-proxy in nftables mode") {
		t.Errorf("Ready %+v", r)
	}
	for _, want := range []string{EventBridgeStarted, EventKubeProxyReconfigured, EventBridgeCompleted} {
		if !s.hasEvent(want) {
			t.Errorf("no %s event in %v", want, s.eventReasons())
		}
	}
	if s.hasEvent(EventBridgeRollingBack) {
		t.Errorf("rolled back: %v", s.eventReasons())
	}
	// The bridge ran with kube-proxy's own cluster CIDR: every node was
	// asked for nftables with it.
	if !strings.Contains(strings.Join(s.specLog, " "), "node-00=nftables") {
		t.Errorf("spec writes %v", s.specLog)
	}
	// Steady: more passes change nothing.
	writes, n := s.configWrites, len(s.specLog)
	s.runBridge(5, nil)
	if len(s.specLog) != n || s.configWrites != writes {
		t.Errorf("a completed change keeps writing: %v", s.specLog[n:])
	}

	// And back: from nftables, restoring the file byte for byte.
	s.edit("pc", func(c *v1alpha1.ProxyConfig) { c.Spec.KubeProxy.Mode = v1alpha1.ModeIPTables })
	s.runBridge(200, func() bool {
		return c.Status.Phase == v1alpha1.RolloutCompleted && c.Status.ObservedGeneration == c.Generation
	})
	if b := c.Status.KubeProxyBridge; b.From != v1alpha1.ModeNFTables || b.To != v1alpha1.ModeIPTables || b.Stage != v1alpha1.BridgeCompleted {
		t.Errorf("bridge status of the way back %+v", b)
	}
	if got := s.kubeProxy.Config.Data["config.conf"]; got != kubeProxyConf {
		t.Errorf("ConfigMap not restored byte for byte:\n%s", got)
	}
	for name, pn := range s.pns {
		if pn.Status.KubeProxyMode != v1alpha1.ModeIPTables {
			t.Errorf("%s: kube-proxy mode %s after the way back", name, pn.Status.KubeProxyMode)
		}
	}
}

// TestBridgeKeepsKubeProxyNodePortAddresses: kube-proxy's nftables mode
// answers NodePorts on the node's primary addresses when its file sets no
// nodePortAddresses. The bridge keeps that while the ConfigMap's mode
// line changes under it (to iptables, where the same file would mean
// every address), and its nodes are asked for the bridge once each.
func TestBridgeKeepsKubeProxyNodePortAddresses(t *testing.T) {
	s := newBridgeSim(t, 3, v1alpha1.ModeIPTables)
	s.kubeProxy.Config.Data["config.conf"] = strings.Replace(kubeProxyConf, `mode: ""`, "mode: nftables", 1)
	for _, a := range s.agents {
		a.kubeProxyMode = v1alpha1.ModeNFTables
	}
	s.runBridge(200, s.phaseIs("pc", v1alpha1.RolloutCompleted))
	if s.configMode() != v1alpha1.ModeIPTables {
		t.Fatalf("ConfigMap mode %s, want iptables", s.configMode())
	}
	for _, sp := range s.bridgeSpecs {
		if got := sp.Settings.NodePortAddresses; len(got) != 1 || got[0] != v1alpha1.NodePortAddressPrimary {
			t.Errorf("the bridge (%s) was asked for nodePortAddresses %q, want [primary] as kube-proxy's nftables mode had it", sp.DesiredMode, got)
		}
	}
	if len(s.bridgeSpecs) != len(s.nodes) {
		t.Errorf("%d bridge spec writes for %d nodes: the bridge's settings changed with the ConfigMap's mode", len(s.bridgeSpecs), len(s.nodes))
	}
}

// TestBridgeRollsBackAFailedHandBack: the canary fails once handed back
// to kube-proxy in its new mode; every node ends on kube-proxy in its old
// mode and the ConfigMap is restored byte for byte.
func TestBridgeRollsBackAFailedHandBack(t *testing.T) {
	s := newBridgeSim(t, 3, v1alpha1.ModeNFTables)
	s.failHandBackInto = v1alpha1.ModeNFTables
	c := s.cfg("pc")
	s.runBridge(300, func() bool {
		return c.Status.Phase == v1alpha1.RolloutFailed && c.Status.KubeProxyBridge != nil && c.Status.KubeProxyBridge.Stage == v1alpha1.BridgeCompleted
	})
	if got := s.kubeProxy.Config.Data["config.conf"]; got != kubeProxyConf {
		t.Errorf("ConfigMap not restored byte for byte:\n%s", got)
	}
	if _, ok := s.kubeProxy.Config.Annotations[kubeproxyconfig.AnnotationPrevious]; ok {
		t.Error("the previous-config annotation stayed")
	}
	for name, pn := range s.pns {
		if pn.Status.ActiveMode != v1alpha1.ModeKubeProxy || pn.Status.KubeProxyMode != v1alpha1.ModeIPTables {
			t.Errorf("%s: active %s, kube-proxy mode %s", name, pn.Status.ActiveMode, pn.Status.KubeProxyMode)
		}
	}
	b := c.Status.KubeProxyBridge
	if !b.RollingBack || b.To != v1alpha1.ModeIPTables || !strings.Contains(b.Failure, "node-00") {
		t.Errorf("bridge status %+v", b)
	}
	if d := s.cond("pc", v1alpha1.ConditionDegraded); d.Reason != ReasonRolledBack {
		t.Errorf("Degraded %+v", d)
	}
	if r := s.cond("pc", v1alpha1.ConditionReady); r.Status != metav1.ConditionFalse {
		t.Errorf("Ready %+v", r)
	}
	// Only the canary was handed back into nftables.
	into := 0
	for _, m := range s.handBackModes {
		if m == v1alpha1.ModeNFTables {
			into++
		}
	}
	if into != 1 {
		t.Errorf("%d hand-backs into nftables, want the canary's only (%v)", into, s.handBackModes)
	}
	if s.configWrites != 2 {
		t.Errorf("%d ConfigMap writes, want 2 (change, restore)", s.configWrites)
	}
	// The failure holds: later passes move nothing.
	n := len(s.specLog)
	s.runBridge(10, nil)
	if len(s.specLog) != n || c.Status.Phase != v1alpha1.RolloutFailed {
		t.Errorf("a rolled-back change moved on: %v, phase %s", s.specLog[n:], c.Status.Phase)
	}
}

// TestBridgeRefusals: what stops a change before any node moves.
func TestBridgeRefusals(t *testing.T) {
	for _, tc := range []struct {
		name   string
		to     v1alpha1.ProxyMode
		mut    func(*bridgeSim)
		reason string
		msg    string
	}{
		{name: "kube-proxy on other nodes", to: v1alpha1.ModeNFTables, mut: func(s *bridgeSim) { s.extraPods = []string{"edge-1"} },
			reason: ReasonKubeProxyScope, msg: "edge-1"},
		{name: "a node without IPVS", to: v1alpha1.ModeIPVS, mut: func(s *bridgeSim) {
			s.cfg("pc").Spec.KubeProxy.Bridge = v1alpha1.ModeNFTables
			s.agents["node-01"].facts = noIPVS()
		}, reason: ReasonPreflightFailed, msg: "node-01: cannot run kube-proxy in ipvs mode"},
		// proxyshift's ipvs mode and kube-proxy's program the same IPVS
		// virtual services: the ipvs bridge can neither hand nodes back to
		// kube-proxy in ipvs mode (the default bridge of a change to ipvs)
		// nor take them over from it.
		{name: "the ipvs bridge into kube-proxy ipvs", to: v1alpha1.ModeIPVS, mut: func(*bridgeSim) {},
			reason: ReasonKubeProxyConfig, msg: "proxyshift ipvs cannot bridge kube-proxy iptables → ipvs: kube-proxy's IPVS mode and proxyshift's ipvs mode program the same IPVS virtual services"},
		{name: "the ipvs bridge out of kube-proxy ipvs", to: v1alpha1.ModeNFTables, mut: func(s *bridgeSim) {
			s.cfg("pc").Spec.KubeProxy.Bridge = v1alpha1.ModeIPVS
			s.kubeProxy.Config.Data["config.conf"] = strings.Replace(kubeProxyConf, `mode: ""`, "mode: ipvs", 1)
			for _, a := range s.agents {
				a.kubeProxyMode = v1alpha1.ModeIPVS
			}
		}, reason: ReasonKubeProxyConfig, msg: "proxyshift ipvs cannot bridge kube-proxy ipvs → nftables"},
		{name: "--proxy-mode in the DaemonSet", to: v1alpha1.ModeNFTables, mut: func(s *bridgeSim) { s.kubeProxy.ModeFlag = "iptables" },
			reason: ReasonKubeProxyConfig, msg: "--proxy-mode=iptables"},
		{name: "no ConfigMap", to: v1alpha1.ModeNFTables, mut: func(s *bridgeSim) { s.kubeProxy.Config = nil },
			reason: ReasonKubeProxyConfig, msg: "kube-system/kube-proxy:config.conf (--kube-proxy-configmap) was not found"},
		{name: "nodePortAddresses proxyshift cannot say", to: v1alpha1.ModeNFTables, mut: func(s *bridgeSim) {
			s.kubeProxy.Config.Data["config.conf"] = kubeProxyConf + "nodePortAddresses: [primary, 198.18.0.0/15]\n"
		}, reason: ReasonKubeProxyConfig, msg: "proxyshift cannot serve the nodes with kube-proxy's settings while its mode changes: its nodePortAddresses [primary 198.18.0.0/15] has the keyword primary beside CIDRs"},
		{name: "a ConfigMap it cannot read", to: v1alpha1.ModeNFTables, mut: func(s *bridgeSim) {
			s.kubeProxy.Config.Data["config.conf"] = "kind: KubeProxyConfiguration\nmode: kernelspace\n"
		}, reason: ReasonKubeProxyConfig, msg: `mode "kernelspace"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newBridgeSim(t, 3, tc.to)
			tc.mut(s)
			s.runBridge(5, nil)
			if len(s.specLog) != 0 {
				t.Errorf("nodes moved: %v", s.specLog)
			}
			d := s.cond("pc", v1alpha1.ConditionDegraded)
			if d.Reason != tc.reason || !strings.Contains(d.Message, tc.msg) {
				t.Errorf("Degraded %s: %s; want %s mentioning %q", d.Reason, d.Message, tc.reason, tc.msg)
			}
		})
	}
}

// TestBridgeWrongModeFails: a kube-proxy that comes back in another mode
// than its ConfigMap says is a failed node, and the change rolls back.
func TestBridgeWrongModeFails(t *testing.T) {
	s := newBridgeSim(t, 2, v1alpha1.ModeNFTables)
	c := s.cfg("pc")
	stale := false
	s.runBridge(300, func() bool {
		// node-00's kube-proxy keeps starting from an old copy.
		if pn := s.pns["node-00"]; pn != nil && pn.Spec.DesiredMode == v1alpha1.ModeKubeProxy && pn.Status.KubeProxyMode == v1alpha1.ModeNFTables {
			pn.Status.KubeProxyMode, stale = v1alpha1.ModeIPTables, true
		}
		return c.Status.Phase == v1alpha1.RolloutFailed && c.Status.KubeProxyBridge.Stage == v1alpha1.BridgeCompleted
	})
	if !stale || !strings.Contains(c.Status.KubeProxyBridge.Failure, "kube-proxy came back in iptables mode, not nftables") {
		t.Errorf("stale=%v bridge %+v", stale, c.Status.KubeProxyBridge)
	}
	if s.configMode() != v1alpha1.ModeIPTables {
		t.Errorf("ConfigMap says %s after the rollback", s.configMode())
	}
}

// TestBridgePolicyEditKeepsTheChange: an edit of the spec that keeps
// spec.kubeProxy (a new node timeout, a pause) goes on with the change
// where it stands: while the nodes are handed back, From stays the mode a
// failure returns to; while the change rolls back, the rollback finishes.
func TestBridgePolicyEditKeepsTheChange(t *testing.T) {
	t.Run("handing back", func(t *testing.T) {
		s := newBridgeSim(t, 3, v1alpha1.ModeNFTables)
		c := s.cfg("pc")
		s.runBridge(300, func() bool {
			return c.Status.KubeProxyBridge != nil && c.Status.KubeProxyBridge.Stage == v1alpha1.BridgeHandingBack
		})
		s.edit("pc", func(c *v1alpha1.ProxyConfig) { c.Spec.Rollout.Paused = true })
		s.runBridge(3, nil)
		b := c.Status.KubeProxyBridge
		if b.From != v1alpha1.ModeIPTables || b.To != v1alpha1.ModeNFTables || b.Stage != v1alpha1.BridgeHandingBack || b.ObservedGeneration != c.Generation {
			t.Errorf("after pausing, bridge status %+v; want iptables → nftables, handing back, generation %d", *b, c.Generation)
		}
	})
	t.Run("rolling back", func(t *testing.T) {
		s := newBridgeSim(t, 3, v1alpha1.ModeNFTables)
		s.failHandBackInto = v1alpha1.ModeNFTables
		c := s.cfg("pc")
		s.runBridge(300, func() bool { return c.Status.KubeProxyBridge != nil && c.Status.KubeProxyBridge.RollingBack })
		s.edit("pc", func(c *v1alpha1.ProxyConfig) { c.Spec.Rollout.NodeTimeout = "6m" })
		s.runBridge(300, func() bool {
			return c.Status.Phase == v1alpha1.RolloutFailed && c.Status.KubeProxyBridge.Stage == v1alpha1.BridgeCompleted
		})
		if d := s.cond("pc", v1alpha1.ConditionDegraded); d.Reason != ReasonRolledBack {
			t.Errorf("Degraded %+v, want %s", d, ReasonRolledBack)
		}
		if got := s.configMode(); got != v1alpha1.ModeIPTables {
			t.Errorf("kube-proxy's ConfigMap says %s after the rollback, want iptables", got)
		}
		for name, pn := range s.pns {
			if pn.Status.ActiveMode != v1alpha1.ModeKubeProxy || pn.Status.KubeProxyMode != v1alpha1.ModeIPTables {
				t.Errorf("%s: active %s, kube-proxy mode %s", name, pn.Status.ActiveMode, pn.Status.KubeProxyMode)
			}
		}
		// Once the change ended, an edit is a retry: a change from what
		// the ConfigMap says now.
		s.failHandBackInto = ""
		s.edit("pc", func(c *v1alpha1.ProxyConfig) { c.Spec.Rollout.NodeTimeout = "7m" })
		s.runBridge(300, func() bool {
			return c.Status.Phase == v1alpha1.RolloutCompleted && c.Status.KubeProxyBridge.Stage == v1alpha1.BridgeCompleted
		})
		if b := c.Status.KubeProxyBridge; b.RollingBack || b.From != v1alpha1.ModeIPTables || s.configMode() != v1alpha1.ModeNFTables {
			t.Errorf("the retry ended with bridge %+v, ConfigMap %s", *b, s.configMode())
		}
	})
}
