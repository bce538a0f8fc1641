package plan

import (
	"fmt"
	"math/rand"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
)

// TestRandomized drives many random worlds (sizes, budgets, canaries,
// failures, slow agents, pauses, new targets, joins, deletions, crashes,
// nodes leaving the selection, conflicts with another config) and checks
// the safety invariant at every step and that each settles.
func TestRandomized(t *testing.T) {
	modes := []v1alpha1.ProxyMode{v1alpha1.ModeIPTables, v1alpha1.ModeNFTables, v1alpha1.ModeIPVS}
	for seed := int64(1); seed <= 400; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			r := rand.New(rand.NewSource(seed))
			n := 1 + r.Intn(25)
			var mu intstr.IntOrString
			if r.Intn(2) == 0 {
				mu = intstr.FromInt32(int32(1 + r.Intn(5)))
			} else {
				mu = intstr.FromString(fmt.Sprintf("%d%%", 1+r.Intn(100)))
			}
			pause := v1alpha1.Duration("")
			if r.Intn(3) == 0 {
				pause = v1alpha1.Duration(fmt.Sprintf("%ds", r.Intn(60)))
			}
			s := newSim(t, n, modes[1+r.Intn(2)], maxU(mu), canary(int32(r.Intn(4)), pause),
				autoRollback(r.Intn(3) != 0), func(c *v1alpha1.ProxyConfig) { c.Spec.Rollout.NodeTimeout = "2m" })
			for _, node := range s.nodes { // in order: the draws must be reproducible
				a := s.agents[node.Name]
				a.delay = time.Duration(r.Intn(20)) * time.Second
				if r.Intn(15) == 0 {
					a.failOn = map[v1alpha1.ProxyMode]bool{modes[r.Intn(3)]: true}
				}
				if r.Intn(30) == 0 {
					a.hang = true
				}
			}
			if r.Intn(4) == 0 {
				s.dropNodeWrites = func(step int) bool { return r.Intn(4) == 0 }
			}
			for i := 0; i < 400; i++ {
				s.steps(1)
				switch x := r.Intn(200); {
				case x == 0:
					s.edit("pc", func(c *v1alpha1.ProxyConfig) { c.Spec.Mode = modes[r.Intn(3)] })
				case x == 1:
					s.edit("pc", func(c *v1alpha1.ProxyConfig) { c.Spec.Rollout.Paused = !c.Spec.Rollout.Paused })
				case x == 2:
					s.addNode(fmt.Sprintf("late-%d", i), map[string]string{"pool": "a"})
				case x == 3 && len(s.nodes) > 1:
					s.nodes = s.nodes[1:]
				case x == 4: // a node moves between pools
					lbl := s.nodes[r.Intn(len(s.nodes))].Labels
					lbl["pool"] = map[string]string{"a": "b", "b": "a"}[lbl["pool"]]
				case x == 5: // pc's selector narrows to pool a, or widens again
					s.edit("pc", func(c *v1alpha1.ProxyConfig) {
						if c.Spec.NodeSelector == nil {
							selector(map[string]v1alpha1.LabelValue{"pool": "a"})(c)
						} else {
							c.Spec.NodeSelector = nil
						}
					})
				case x == 6: // another config for pool b comes or goes
					if len(s.cfgs) == 1 {
						s.addConfig("other", modes[r.Intn(3)], selector(map[string]v1alpha1.LabelValue{"pool": "b"}))
					} else {
						s.cfgs = s.cfgs[:1]
					}
				}
			}
			// Unpause, select every node again and drop the other config
			// (pc stays Pending while it selects no node, or only
			// conflicting ones), stop injecting crashes, and let it settle.
			if c := s.cfg("pc"); c.Spec.Rollout.Paused || c.Spec.NodeSelector != nil {
				s.edit("pc", func(c *v1alpha1.ProxyConfig) { c.Spec.Rollout.Paused, c.Spec.NodeSelector = false, nil })
			}
			s.cfgs = s.cfgs[:1]
			s.dropNodeWrites = nil
			s.run(2000, func() bool {
				switch s.cfg("pc").Status.Phase {
				case v1alpha1.RolloutCompleted, v1alpha1.RolloutFailed:
					return true
				}
				return false
			})
			st := s.cfg("pc").Status
			if st.Phase == v1alpha1.RolloutCompleted && st.Nodes.Updated != st.Nodes.Selected {
				if c := s.cond("pc", v1alpha1.ConditionDegraded); c.Status != metav1.ConditionTrue {
					t.Errorf("Completed at %s without saying why", st.Nodes.Summary)
				}
			}
			if st.Phase == v1alpha1.RolloutFailed {
				if c := s.cond("pc", v1alpha1.ConditionDegraded); c.Status != metav1.ConditionTrue || c.Message == "" {
					t.Errorf("Failed without a Degraded reason: %+v", c)
				}
			}
		})
	}
}

func countEvents(es []Event, reason string) int {
	n := 0
	for _, e := range es {
		if e.Reason == reason {
			n++
		}
	}
	return n
}
