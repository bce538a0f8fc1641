package gcpercent

import (
	"flag"
	"runtime/debug"
	"testing"
)

func TestPercent(t *testing.T) {
	const def = 50
	tests := []struct {
		name      string
		flag      int
		flagGiven bool
		env       string
		want      int
		set       bool
	}{
		{"neither: the binary's default", def, false, "", 50, true},
		{"the environment's GOGC stays", def, false, "200", 0, false},
		{"GOGC=off stays", def, false, "off", 0, false},
		{"a GOGC the runtime ignores: the default", def, false, "lots", 50, true},
		{"the flag wins over the environment", 30, true, "200", 30, true},
		{"the flag alone", 100, true, "", 100, true},
	}
	for _, tt := range tests {
		if got, set := percent(tt.flag, tt.flagGiven, tt.env, def); got != tt.want || set != tt.set {
			t.Errorf("%s: percent(%d, %v, %q, %d) = %d, %v; want %d, %v", tt.name, tt.flag, tt.flagGiven, tt.env, def, got, set, tt.want, tt.set)
		}
	}
}

// Apply sets what the flag set says: the default when the flag is not
// given, the flag's value when it is.
func TestApplySetsTheCollector(t *testing.T) {
	t.Setenv("GOGC", "")
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	for _, tt := range []struct {
		args []string
		want int
	}{{nil, 37}, {[]string{"--gc-percent=61"}, 61}} {
		fs := flag.NewFlagSet("test", flag.ContinueOnError)
		f := Bind(fs, 37, "test.")
		if err := fs.Parse(tt.args); err != nil {
			t.Fatal(err)
		}
		f.Apply()
		if got := debug.SetGCPercent(100); got != tt.want {
			t.Errorf("args %v: GOGC %d, want %d", tt.args, got, tt.want)
		}
	}
}
