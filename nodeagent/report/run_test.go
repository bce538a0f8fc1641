package report

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"

	"github.com/proxyshift/proxyshift/api/v1alpha1"
)

// proxyNodeServer stands in for the API server's ProxyNode status
// endpoint: a PATCH succeeds while a ProxyNode exists (with uid) and is
// not found otherwise.
type proxyNodeServer struct {
	mu       sync.Mutex
	uid      types.UID // "" none
	failed   int
	patched  chan types.UID
	failures chan int
}

func (s *proxyNodeServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	uid := s.uid
	if uid == "" {
		s.failed++
	}
	failed := s.failed
	s.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	if r.Method != http.MethodPatch || uid == "" {
		w.WriteHeader(http.StatusNotFound)
		_ = json.NewEncoder(w).Encode(metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: metav1.StatusFailure,
			Reason: metav1.StatusReasonNotFound, Code: http.StatusNotFound, Message: `proxynodes "n" not found`})
		s.failures <- failed
		return
	}
	_ = json.NewEncoder(w).Encode(v1alpha1.ProxyNode{
		TypeMeta:   metav1.TypeMeta{Kind: "ProxyNode", APIVersion: v1alpha1.GroupVersion.String()},
		ObjectMeta: metav1.ObjectMeta{Name: "n", UID: uid},
	})
	s.patched <- uid
}

func (s *proxyNodeServer) set(uid types.UID) {
	s.mu.Lock()
	s.uid = uid
	s.mu.Unlock()
}

// TestRunWritesAtOnceToARecreatedProxyNode: while its ProxyNode is gone,
// the reporter's writes are not found and it backs off (0.5 s doubling up
// to 30 s); a recreated ProxyNode, once observed, gets the status at once
// rather than after the backoff reached meanwhile.
func TestRunWritesAtOnceToARecreatedProxyNode(t *testing.T) {
	api := &proxyNodeServer{uid: "a", patched: make(chan types.UID, 100), failures: make(chan int, 100)}
	srv := httptest.NewServer(api)
	defer srv.Close()
	c, err := NewClient(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	r := New(c, "n")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go r.Run(ctx)
	r.SetSwitch(Switch{Phase: v1alpha1.NodeActive, Active: v1alpha1.ModeNFTables})
	if uid := <-api.patched; uid != "a" {
		t.Fatalf("first write to %s", uid)
	}

	api.set("")
	r.SetSwitch(Switch{Phase: v1alpha1.NodeActive, Active: v1alpha1.ModeIPTables})
	// Five failures: the writes 0, 0.5, 1.5, 3.5 and 7.5 s after the
	// first one; the next waits 8 s.
	for n := 0; n < 5; n = <-api.failures {
	}
	api.set("b")
	observed := time.Now()
	r.Observe(&v1alpha1.ProxyNode{ObjectMeta: metav1.ObjectMeta{Name: "n", UID: "b"}})
	select {
	case uid := <-api.patched:
		if uid != "b" {
			t.Errorf("wrote to %s, want the recreated b", uid)
		}
		t.Logf("written %s after the recreated ProxyNode was observed", time.Since(observed).Round(time.Millisecond))
	case <-time.After(6 * time.Second):
		t.Fatal("the recreated ProxyNode got no status within 6 s: the write waited for the backoff of the failed ones (8 s)")
	}
}
