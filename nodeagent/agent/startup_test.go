package agent

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestServeRetriesAFailedListen takes the port the health endpoint wants
// before it starts: the agent keeps running and serves as soon as the
// port is free, instead of exiting.
func TestServeRetriesAFailedListen(t *testing.T) {
	squatter, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := squatter.Addr().String()
	h := &health{timeout: time.Minute}
	h.wait("the first list of Services")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		serve(ctx, &http.Server{Addr: addr, Handler: h.mux(), ReadHeaderTimeout: time.Second})
		close(done)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Error("serve did not return after its context ended")
		}
	})

	time.Sleep(700 * time.Millisecond) // a failed listen and a retry at least
	select {
	case <-done:
		t.Fatal("serve gave up on a taken port")
	default:
	}
	_ = squatter.Close()

	hc := &http.Client{Timeout: time.Second}
	get := func(path string) (int, string, error) {
		resp, err := hc.Get("http://" + addr + path)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), nil
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		code, _, err := get("/livez")
		if err == nil && code == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/livez did not answer within 10s of the port being freed: %d %v", code, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	code, body, err := get("/healthz")
	if err != nil || code != http.StatusServiceUnavailable || !strings.Contains(body, "the first list of Services") || !strings.Contains(body, "keep serving") {
		t.Errorf("/healthz while starting: %d %q %v; want 503 saying what it waits for", code, body, err)
	}
}
