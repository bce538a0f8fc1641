package dataplane

import (
	"context"
	"errors"
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
