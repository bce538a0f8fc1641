package nsexec

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The command reads its input while OutputFrom's writer still writes:
// the writer waits, before it writes the rest, until the command has
// acted on the first line.
func TestOutputFromStreams(t *testing.T) {
	seen := filepath.Join(t.TempDir(), "seen")
	write := func(w io.Writer) error {
		if _, err := io.WriteString(w, "first\n"); err != nil {
			return err
		}
		deadline := time.Now().Add(10 * time.Second)
		for {
			if b, err := os.ReadFile(seen); err == nil && string(b) == "first\n" {
				break
			}
			if time.Now().After(deadline) {
				return errors.New("the command did not read the first line while the input was being written")
			}
			time.Sleep(5 * time.Millisecond)
		}
		for i := range 1000 {
			if _, err := fmt.Fprintf(w, "line %d\n", i); err != nil {
				return err
			}
		}
		return nil
	}
	out, err := Current.OutputFrom(context.Background(), nil, write, "sh", "-c", `read x && echo "$x" > "$1" && wc -l`, "sh", seen)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(string(out)); got != "1000" {
		t.Errorf("the command counted %q lines after the first, want 1000", got)
	}
}

// A writer that fails for its own reasons gets the command killed before
// its input ends: a command that acts at the end of its input (as
// iptables-restore commits at COMMIT) never acts on a part.
func TestOutputFromWriteErrorKills(t *testing.T) {
	acted := filepath.Join(t.TempDir(), "acted")
	boom := errors.New("boom")
	write := func(w io.Writer) error {
		if _, err := io.WriteString(w, "part of the input\n"); err != nil {
			return err
		}
		return boom
	}
	_, err := Current.OutputFrom(context.Background(), nil, write, "sh", "-c", `cat > /dev/null && touch "$1"`, "sh", acted)
	if !errors.Is(err, boom) {
		t.Errorf("error %v, want one that wraps the writer's", err)
	}
	if _, serr := os.Stat(acted); serr == nil {
		t.Error("the command reached the end of its input and acted on the part written")
	}
}

// writeMoreThanAPipeHolds writes 4 MiB: a command that does not read
// them breaks the pipe.
func writeMoreThanAPipeHolds(w io.Writer) error {
	chunk := strings.Repeat("x", 64<<10)
	for range 64 {
		if _, err := io.WriteString(w, chunk); err != nil {
			return err
		}
	}
	return nil
}

// A command that stops reading (it failed, or needs no more) breaks the
// writer's pipe: the error is the command's, with its standard error.
func TestOutputFromCommandStopsReading(t *testing.T) {
	_, err := Current.OutputFrom(context.Background(), nil, writeMoreThanAPipeHolds, "sh", "-c", `echo "line 1 failed" >&2; exit 3`)
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 3 {
		t.Fatalf("error %v, want the command's exit status 3", err)
	}
	var ne *Error
	if !errors.As(err, &ne) || ne.Stderr != "line 1 failed" {
		t.Errorf("error %#v, want the command's standard error in it", err)
	}
}

// A command that exits successfully before reading all of its input is
// an error too: the caller meant all of it to be read.
func TestOutputFromCommandExitsEarly(t *testing.T) {
	_, err := Current.OutputFrom(context.Background(), nil, writeMoreThanAPipeHolds, "true")
	if err == nil || !strings.Contains(err.Error(), "before reading all of its input") {
		t.Errorf("error %v, want one saying the command exited before reading its input", err)
	}
}

// env adds to the command's environment, but never replaces what the
// process has.
func TestOutputFromEnv(t *testing.T) {
	t.Setenv("NSEXEC_TEST_KEPT", "the process's")
	none := func(io.Writer) error { return nil }
	out, err := Current.OutputFrom(context.Background(), []string{"NSEXEC_TEST_ADDED=added", "NSEXEC_TEST_KEPT=replaced"}, none,
		"sh", "-c", `echo "$NSEXEC_TEST_ADDED, $NSEXEC_TEST_KEPT, $HOME"`)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := strings.TrimSpace(string(out)), "added, the process's, "+os.Getenv("HOME"); got != want {
		t.Errorf("the command saw %q, want %q", got, want)
	}
}

// Output feeds its stdin to the command and returns what it printed.
func TestOutputFeedsStdin(t *testing.T) {
	out, err := Current.Output(context.Background(), []byte("one\ntwo\n"), "wc", "-l")
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(string(out)); got != "2" {
		t.Errorf("the command counted %q lines, want 2", got)
	}
}
