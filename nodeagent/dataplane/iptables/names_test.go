package iptables

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/proxyshift/proxyshift/nodeagent/dataplane"
	dt "github.com/proxyshift/proxyshift/nodeagent/dataplane/dataplanetest"
	"github.com/proxyshift/proxyshift/nodeagent/model"
)

// weakHash makes hashed return collide for the strings weak picks (the
// same name for all of them) and SHA-256 for the rest, until the test
// ends.
func weakHash(t *testing.T, weak func(string) bool) {
	real := hashed
	hashed = func(s string) string {
		if weak(s) {
			return strings.Repeat("A", 52)
		}
		return real(s)
	}
	t.Cleanup(func() { hashed = real })
}

// requireCollision fails the test unless err is a *NameCollisionError
// naming first and second.
func requireCollision(t *testing.T, err error, first, second string) {
	t.Helper()
	var ce *NameCollisionError
	if !errors.As(err, &ce) || ce.First != first || ce.Second != second {
		t.Fatalf("error %v, want a name collision of %s and %s", err, first, second)
	}
	if !strings.Contains(err.Error(), first) || !strings.Contains(err.Error(), second) {
		t.Errorf("%q does not name both", err)
	}
}

func TestPortNameCollision(t *testing.T) {
	weakHash(t, func(s string) bool { return !strings.Contains(s, " -> ") })
	rs := render(policyFor(node, corev1.IPv4Protocol), testPorts())
	requireCollision(t, rs.collisions(), "default/db:sql/TCP", "default/np:http/TCP")
}

// TestEndpointNameCollision: endpoints have chains (and recent lists) of
// their own only under ClientIP affinity, so only there can two of them
// collide.
func TestEndpointNameCollision(t *testing.T) {
	weakHash(t, func(s string) bool { return strings.Contains(s, " -> ") })
	ports := testPorts()
	if err := render(policyFor(node, corev1.IPv4Protocol), ports).collisions(); err != nil {
		t.Fatalf("without affinity: %v, want no collision (no endpoint has a chain)", err)
	}
	ports[nameOf("default", "np", "http")].AffinityTimeout = 3 * time.Hour
	rs := render(policyFor(node, corev1.IPv4Protocol), ports)
	requireCollision(t, rs.collisions(), "default/np:http/TCP -> 10.244.1.5:8080", "default/np:http/TCP -> 10.244.2.5:8080")
}

// TestIncrementalNameCollision: a port added by an incremental sync whose
// prefix a programmed port has fails the sync, before anything is
// written (the backend here has no kernel to write to).
func TestIncrementalNameCollision(t *testing.T) {
	ports := testPorts()
	web := nameOf("default", "web", "http")
	weakHash(t, func(s string) bool { return s == web.String() || s == "default/api:http/TCP" })
	f := families[0]
	b := &Backend{policy: map[*family]*dataplane.NodePolicy{f: policyFor(node, f.model)}, state: map[*family]*ruleset{}}
	rs := render(b.policy[f], ports)
	if err := rs.collisions(); err != nil {
		t.Fatal(err)
	}
	api := dt.PortsOf(dt.Svc("default", "api", "http", "10.96.0.20", 80, dt.EP("10.244.1.20", 80)))
	for n, sp := range api {
		ports[n] = sp
	}
	err := b.incremental(context.Background(), f, rs, ports, model.ChangeSet{nameOf("default", "api", "http"): {}})
	requireCollision(t, err, "default/api:http/TCP", "default/web:http/TCP")
	if _, ok := rs.ports[nameOf("default", "api", "http")]; ok || rs.keys[namesFor(web).key] != web {
		t.Errorf("the failed sync changed the ruleset's memory")
	}
}
