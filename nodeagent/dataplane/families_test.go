package dataplane

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/proxyshift/proxyshift/nodeagent/model"
	"github.com/proxyshift/proxyshift/nodeagent/nsexec"
)

// procSys writes a /proc/sys with net.ipv6.conf.all.disable_ipv6 set to
// disabled, or without net/ipv6 at all when disabled is "".
func procSys(t *testing.T, disabled string) string {
	t.Helper()
	dir := t.TempDir()
	if disabled == "" {
		return dir
	}
	conf := filepath.Join(dir, "net/ipv6/conf/all")
	if err := os.MkdirAll(conf, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(conf, "disable_ipv6"), []byte(disabled+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestWithoutMissingFamilies(t *testing.T) {
	web := model.ServicePortName{Namespace: "default", Name: "web", Port: "p", Protocol: corev1.ProtocolTCP}
	dual := &model.Snapshot{Ports: map[corev1.IPFamily]map[model.ServicePortName]*model.ServicePort{
		corev1.IPv4Protocol: {web: {Name: web, Family: corev1.IPv4Protocol}},
		corev1.IPv6Protocol: {web: {Name: web, Family: corev1.IPv6Protocol}},
	}}
	emptyV6 := &model.Snapshot{Ports: map[corev1.IPFamily]map[model.ServicePortName]*model.ServicePort{
		corev1.IPv4Protocol: dual.Ports[corev1.IPv4Protocol],
		corev1.IPv6Protocol: {},
	}}
	for _, c := range []struct {
		name, disabled string
		model          *model.Snapshot
		wantFamilies   int
		wantReason     string // of the warning; "" for none
	}{
		{name: "IPv6 on", disabled: "0", model: dual, wantFamilies: 2},
		{name: "IPv6 off", disabled: "1", model: dual, wantFamilies: 1, wantReason: "IPv6 is turned off: net.ipv6.conf.all.disable_ipv6 = 1"},
		{name: "no IPv6 in the kernel", disabled: "", model: dual, wantFamilies: 1, wantReason: "the kernel has no IPv6: booted with ipv6.disable=1 or built without it"},
		{name: "IPv6 off, no IPv6 service", disabled: "1", model: emptyV6, wantFamilies: 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			req, err := WithoutMissingFamilies(nsexec.Current, procSys(t, c.disabled), SyncRequest{Model: c.model, Full: true})
			if len(req.Model.Ports) != c.wantFamilies || req.Model.Ports[corev1.IPv4Protocol] == nil || !req.Full {
				t.Errorf("request keeps %v (full %v); want %d families with IPv4", req.Model.Ports, req.Full, c.wantFamilies)
			}
			if len(c.model.Ports) != 2 {
				t.Errorf("the caller's model was changed: %v", c.model.Ports)
			}
			var fm *FamilyMissingError
			switch {
			case c.wantReason == "" && err != nil:
				t.Errorf("error %v; want none", err)
			case c.wantReason != "" && !errors.As(err, &fm):
				t.Errorf("error %v; want a *FamilyMissingError", err)
			case c.wantReason != "":
				if fm.Family != corev1.IPv6Protocol || fm.Reason != c.wantReason || len(fm.Ports) != 1 || fm.Ports[0] != web.String() {
					t.Errorf("warning %+v; want IPv6, %q, [%s]", fm, c.wantReason, web)
				}
				if ws, rest := SplitWarnings(err); len(ws) != 1 || rest != nil {
					t.Errorf("SplitWarnings(%v) = %v, %v; want one warning and no rest", err, ws, rest)
				}
			}
		})
	}
}
