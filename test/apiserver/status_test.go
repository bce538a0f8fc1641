package apiserver_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/proxyshift/proxyshift/api/contract"
	proxyv1alpha1 "github.com/proxyshift/proxyshift/api/v1alpha1"
	"github.com/proxyshift/proxyshift/internal/text"
	"github.com/proxyshift/proxyshift/nodeagent/dataplane/ipvs"
	"github.com/proxyshift/proxyshift/nodeagent/report"
	"github.com/proxyshift/proxyshift/test/testenv"
)

// TestLongErrorsNeverFreezeStatus hands the agent's Reporter errors far
// longer than the API server takes in a condition message (32768 bytes):
// a sync error listing thousands of foreign IPVS virtual services, then
// one of 100 kB. Every status write must be accepted, with the message
// cut to a count and the first items, and the status must keep following
// what happens next.
func TestLongErrorsNeverFreezeStatus(t *testing.T) {
	env := testenv.Start(t)
	ctx := context.Background()
	const node = "node-long"
	if err := env.Client.Create(ctx, &proxyv1alpha1.ProxyNode{ObjectMeta: metav1.ObjectMeta{Name: node}}); err != nil {
		t.Fatal(err)
	}
	c, err := report.NewClient(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	r := report.New(c, node)
	r.SetSwitch(report.Switch{Phase: proxyv1alpha1.NodeActive, Active: proxyv1alpha1.ModeIPVS, Generation: 1})

	var keys []string
	for i := range 5000 {
		keys = append(keys, fmt.Sprintf("TCP/198.19.%d.%d:80", i/250, i%250))
	}
	degraded := func(t *testing.T) *metav1.Condition {
		t.Helper()
		if err := r.Flush(ctx); err != nil {
			t.Fatalf("status write refused: %v", err)
		}
		pn := &proxyv1alpha1.ProxyNode{}
		if err := env.Client.Get(ctx, client.ObjectKey{Name: node}, pn); err != nil {
			t.Fatal(err)
		}
		for _, c := range pn.Status.Conditions {
			if len(c.Message) > text.MaxMessage {
				t.Errorf("condition %s message is %d bytes, more than %d", c.Type, len(c.Message), text.MaxMessage)
			}
		}
		return meta.FindStatusCondition(pn.Status.Conditions, contract.ConditionDegraded)
	}

	t.Run("thousands of foreign virtual services", func(t *testing.T) {
		r.SetSync(report.Sync{Time: time.Now(), Err: &ipvs.ConflictError{Keys: keys}})
		d := degraded(t)
		if d == nil || d.Reason != contract.ReasonSyncFailed || !strings.Contains(d.Message, "5000 virtual services") ||
			!strings.Contains(d.Message, keys[0]) || !strings.Contains(d.Message, "and 4990 more") {
			t.Errorf("Degraded %+v; want SyncFailed with the count, the first keys and how many more", d)
		}
	})
	t.Run("a 100 kB error", func(t *testing.T) {
		r.SetSync(report.Sync{Time: time.Now(), Err: errors.New("nftables: " + strings.Repeat("x", 100000))})
		if d := degraded(t); d == nil || !strings.Contains(d.Message, "nftables: xxx") || !strings.HasSuffix(d.Message, "...") {
			t.Errorf("Degraded %+v; want the error's start, cut", d)
		}
	})
	t.Run("and the status still follows", func(t *testing.T) {
		r.SetSync(report.Sync{Time: time.Now()})
		if d := degraded(t); d == nil || d.Status != metav1.ConditionFalse {
			t.Errorf("Degraded %+v after a good sync; want False", d)
		}
	})
}
