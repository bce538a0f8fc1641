package main

import "testing"

func TestGCPercent(t *testing.T) {
	tests := []struct {
		name      string
		flag      int
		flagGiven bool
		env       string
		want      int
		set       bool
	}{
		{"neither: the agent's default", defaultGCPercent, false, "", 50, true},
		{"the environment's GOGC stays", defaultGCPercent, false, "200", 0, false},
		{"GOGC=off stays", defaultGCPercent, false, "off", 0, false},
		{"a GOGC the runtime ignores: the default", defaultGCPercent, false, "lots", 50, true},
		{"the flag wins over the environment", 30, true, "200", 30, true},
		{"the flag alone", 100, true, "", 100, true},
	}
	for _, tt := range tests {
		if got, set := gcPercent(tt.flag, tt.flagGiven, tt.env); got != tt.want || set != tt.set {
			t.Errorf("%s: gcPercent(%d, %v, %q) = %d, %v; want %d, %v", tt.name, tt.flag, tt.flagGiven, tt.env, got, set, tt.want, tt.set)
		}
	}
}
