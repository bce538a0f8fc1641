package report

import (
	"errors"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/proxyshift/proxyshift/api/contract"
	"github.com/proxyshift/proxyshift/api/v1alpha1"
	"github.com/proxyshift/proxyshift/nodeagent/dataplane"
)

// TestMissingFamilyIsDegraded: a serving mode whose syncs skip the IPv6
// Service ports of a node without IPv6 is Ready and Degraded with reason
// FamilyMissing, naming the family and why; a foreign object alongside
// makes it ForeignObjects again.
func TestMissingFamilyIsDegraded(t *testing.T) {
	missing := &dataplane.FamilyMissingError{Family: corev1.IPv6Protocol, Reason: "IPv6 is turned off: net.ipv6.conf.all.disable_ipv6 = 1", Ports: []string{"default/web:p/TCP"}}
	for _, c := range []struct {
		warning error
		reason  string
	}{
		{errors.Join(missing), contract.ReasonFamilyMissing},
		{errors.Join(missing, foreignObject{}), contract.ReasonForeignObjects},
	} {
		r := New(nil, "n")
		r.SetSwitch(Switch{Phase: v1alpha1.NodeActive, Active: v1alpha1.ModeNFTables, Target: v1alpha1.ModeNFTables, Generation: 2})
		r.SetSync(Sync{Time: time.Now(), Counts: dataplane.Counts{Services: 2}, Warning: c.warning})
		st := r.Status()
		ready := meta.FindStatusCondition(st.Conditions, contract.ConditionReady)
		deg := meta.FindStatusCondition(st.Conditions, contract.ConditionDegraded)
		if ready.Status != metav1.ConditionTrue || deg.Status != metav1.ConditionTrue || deg.Reason != c.reason ||
			!strings.Contains(deg.Message, "disable_ipv6 = 1") || !strings.Contains(deg.Message, "default/web:p/TCP") {
			t.Errorf("warning %q: ready %+v, degraded %+v; want Ready and Degraded %s", c.warning, ready, deg, c.reason)
		}
	}
}

// foreignObject is a dataplane.Warning about another program's object.
type foreignObject struct{}

func (foreignObject) Error() string       { return "another program's object, left alone" }
func (foreignObject) LeftAlone() []string { return []string{"object"} }
