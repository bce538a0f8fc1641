package dataplane

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"testing"
)

// plainBackend sets no kernel settings.
type plainBackend struct{}

func (plainBackend) Mode() string                                      { return "nftables" }
func (plainBackend) Sync(context.Context, SyncRequest) (Counts, error) { return Counts{}, nil }
func (plainBackend) Programmed(context.Context) (Counts, error)        { return Counts{}, nil }
func (plainBackend) Cleanup(context.Context) ([]string, error)         { return nil, nil }

// settingBackend sets kernel settings and reads them back.
type settingBackend struct {
	plainBackend
	settings []KernelSetting
	err      error
}

func (b settingBackend) KernelSettings() ([]KernelSetting, error) { return b.settings, b.err }

func TestKernelSettingsAsksOnlyBackendsThatSetThem(t *testing.T) {
	if got, err := KernelSettings(plainBackend{}); got != nil || err != nil {
		t.Errorf("a backend that sets nothing: %v, %v; want none", got, err)
	}
	if got, err := KernelSettings(nil); got != nil || err != nil {
		t.Errorf("no backend: %v, %v; want none", got, err)
	}
	want := []KernelSetting{{Name: "net.ipv4.vs.conntrack", Want: "1", Value: "1"}}
	broken := errors.New("cannot enter the namespace")
	got, err := KernelSettings(settingBackend{settings: want, err: broken})
	if !reflect.DeepEqual(got, want) || !errors.Is(err, broken) {
		t.Errorf("a SettingsReporter: %v, %v; want its settings and its error", got, err)
	}
}

// leftAlone is a Warning.
type leftAlone struct{ what string }

func (w leftAlone) Error() string       { return "left alone: " + w.what }
func (w leftAlone) LeftAlone() []string { return []string{w.what} }

func TestSplitWarnings(t *testing.T) {
	w1, w2, failed := leftAlone{"a"}, leftAlone{"b"}, errors.New("netlink: EPERM")
	for _, tc := range []struct {
		name     string
		err      error
		warnings int
		rest     bool
	}{
		{"nil", nil, 0, false},
		{"a warning", w1, 1, false},
		{"wrapped and joined warnings", fmt.Errorf("ipvs: %w", errors.Join(w1, fmt.Errorf("ip6: %w", w2))), 2, false},
		{"a warning and a failure", errors.Join(w1, failed), 1, true},
		{"a wrapped failure", fmt.Errorf("ipvs: %w", errors.Join(w1, failed)), 1, true},
		{"a failure", failed, 0, true},
	} {
		ws, rest := SplitWarnings(tc.err)
		if len(ws) != tc.warnings || (rest != nil) != tc.rest {
			t.Errorf("%s: %d warnings, rest %v; want %d warnings, rest %v", tc.name, len(ws), rest, tc.warnings, tc.rest)
		}
		if tc.rest && !errors.Is(rest, failed) {
			t.Errorf("%s: the rest %v lost the failure", tc.name, rest)
		}
	}
}
