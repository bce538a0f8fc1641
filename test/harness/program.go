package harness

import (
	"bufio"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// Program is a cluster program (hack/cluster, hack/cluster-real) a test
// started, with the lines it printed up to the end of its summary.
type Program struct {
	Cmd   *exec.Cmd
	Lines []string
}

// StartProgram runs bin with args in dir, as a user would, and reads its
// standard output until a line starting with last (its summary's last
// line) within timeout. It fails the test, quoting the program's standard
// error, if the program ends or the time runs out first. The rest of the
// output is drained; the test signals and waits for Cmd.
func StartProgram(t testing.TB, dir, bin string, args []string, last string, timeout time.Duration) *Program {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr := &strings.Builder{}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &Program{Cmd: cmd}
	lines := make(chan string)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	deadline := time.After(timeout)
	for {
		select {
		case line, ok := <-lines:
			if !ok {
				_ = cmd.Wait()
				t.Fatalf("%s ended before its cluster was up:\n%s", bin, stderr.String())
			}
			p.Lines = append(p.Lines, line)
			if strings.HasPrefix(line, last) {
				go func() {
					for range lines {
					}
				}()
				return p
			}
		case <-deadline:
			_ = cmd.Process.Kill()
			t.Fatalf("no cluster from %s within %v:\n%s", bin, timeout, stderr.String())
		}
	}
}

// Value is what the summary line "key: value" says (trimmed), or "".
func (p *Program) Value(key string) string {
	for _, l := range p.Lines {
		if v, ok := strings.CutPrefix(l, key+":"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}
