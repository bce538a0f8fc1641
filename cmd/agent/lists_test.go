package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// TestFirstListFollowsWatchListFlag starts client-go's Service informer,
// as the agent builds it, against a server that records what it is asked:
// by default its first request is a list from the watch cache, with
// --watch-list a watch asking for the initial events.
func TestFirstListFollowsWatchListFlag(t *testing.T) {
	defer useWatchList(false)
	for _, tc := range []struct {
		watchList bool
		want      map[string]string // query parameters of the first request
		absent    []string
	}{
		{false, map[string]string{"resourceVersion": "0"}, []string{"watch", "sendInitialEvents"}},
		{true, map[string]string{"watch": "true", "sendInitialEvents": "true", "allowWatchBookmarks": "true"}, nil},
	} {
		useWatchList(tc.watchList)
		first := make(chan map[string][]string, 1)
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != "/api/v1/services" {
				http.NotFound(w, r)
				return
			}
			select {
			case first <- r.URL.Query():
			default:
			}
			if r.URL.Query().Get("watch") == "true" {
				<-r.Context().Done()
				return
			}
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`{"kind":"ServiceList","apiVersion":"v1","metadata":{"resourceVersion":"7"},"items":[]}`))
		}))
		client := kubernetes.NewForConfigOrDie(protobuf(&rest.Config{Host: srv.URL}))
		ctx, cancel := context.WithCancel(context.Background())
		factory := informers.NewSharedInformerFactory(client, 0)
		factory.Core().V1().Services().Informer()
		factory.Start(ctx.Done())
		var q map[string][]string
		select {
		case q = <-first:
		case <-time.After(30 * time.Second):
			t.Fatalf("watchList=%v: no request for Services within 30s", tc.watchList)
		}
		cancel()
		factory.Shutdown()
		srv.Close()
		for k, v := range tc.want {
			if got := q[k]; len(got) != 1 || got[0] != v {
				t.Errorf("watchList=%v: first request's %s = %v, want %q (query %v)", tc.watchList, k, got, v, q)
			}
		}
		for _, k := range tc.absent {
			if _, ok := q[k]; ok {
				t.Errorf("watchList=%v: first request has %s (query %v)", tc.watchList, k, q)
			}
		}
	}
}
