package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// Every function's source is valid Python (py_compile; the SDK need not be
// importable for that).
func TestFunctionsCompile(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 not installed")
	}
	dir := t.TempDir()
	for _, sh := range shapes {
		spec := sh.spec(work{effects: filepath.Join(dir, "effects.log"), max: 100 * time.Millisecond})
		for _, f := range spec.Functions {
			if len(f.Command) != 3 || f.Command[0] != "python3" || f.Command[1] != "-c" {
				t.Fatalf("%s/%s: command %q", sh.name, f.Name, f.Command)
			}
			src := filepath.Join(dir, sh.name+"-"+f.Name+".py")
			if err := os.WriteFile(src, []byte(f.Command[2]), 0o644); err != nil {
				t.Fatal(err)
			}
			if out, err := exec.Command(py, "-m", "py_compile", src).CombinedOutput(); err != nil {
				t.Errorf("%s/%s does not compile: %v\n%s\n%s", sh.name, f.Name, err, out, f.Command[2])
			}
		}
	}
}

// Each shape's check takes its right results and refuses the wrong ones.
func TestChecks(t *testing.T) {
	rec := func(fn string) string { return fn + ":" + fn + "-7:0:s/7/0" }
	fanGroups := func(input string) string {
		var gs []string
		for g, keys := range []string{"k0,k3", "k1,k4", "k2,k5"} {
			gs = append(gs, "g"+string(rune('0'+g))+"="+keys+"@"+rec("reduce")+"@"+input+"@"+rec("entry"))
		}
		return strings.Join(gs, ";")
	}
	cases := []struct {
		shape, input, result string
		ok                   bool
	}{
		{"chain", "in", "in|" + rec("c1") + "|" + rec("c2") + "|" + rec("c3"), true},
		{"chain", "in", "in|" + rec("c1") + "|" + rec("c3") + "|" + rec("c2"), false},
		{"chain", "in", "in|" + rec("c1") + "|" + rec("c2"), false},
		{"chain", "in", "other|" + rec("c1") + "|" + rec("c2") + "|" + rec("c3"), false},
		{"fan", "in", fanGroups("in") + "|" + rec("collect"), true},
		{"fan", "in", fanGroups("other") + "|" + rec("collect"), false},
		{"fan", "in", strings.Replace(fanGroups("in"), "k0,k3", "k0", 1) + "|" + rec("collect"), false},
		{"fan", "in", fanGroups("in"), false},
		{"vote", "in", "in:r1@" + rec("worker") + ";in:r3@" + rec("worker") + "|" + rec("decide"), true},
		{"vote", "in", "in:r1@" + rec("worker") + ";in:r1@" + rec("worker") + "|" + rec("decide"), false},
		{"vote", "in", "in:r1@" + rec("worker") + "|" + rec("decide"), false},
		{"window", "in", "in:3:e1,e2,e3|" + rec("agg"), true},
		{"window", "in", "in:2:e1,e2|" + rec("agg"), false},
		{"window", "in", "in+other:3:e1,e2,e3|" + rec("agg"), false},
	}
	for _, c := range cases {
		var sh *shape
		for i := range shapes {
			if shapes[i].name == c.shape {
				sh = &shapes[i]
			}
		}
		err := sh.check(c.input, c.result)
		if (err == nil) != c.ok {
			t.Errorf("%s %q: check says %v, want ok=%v", c.shape, c.result, err, c.ok)
		}
	}
}

// The checker counts a key whose effect happened twice as a violation of
// the phase its session started in, an invocation that ran twice as a
// rerun, and says "no keys" when no invocation had one.
func TestCheckerDuplicates(t *testing.T) {
	dir := t.TempDir()
	effects := filepath.Join(dir, "effects.log")
	lines := "s1 c1:1:0:k1\ns1 c2:2:0:k2\ns1 c2:2:0:k2\ns2 c1:3:0:k3\ntorn"
	if err := os.WriteFile(effects, []byte(lines), 0o644); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	m := &modeRun{cfg: config{duration: time.Minute, rate: 1, sessionDeadline: time.Minute}, mode: "test", out: &out, effects: effects,
		phases: []string{"none", "kill-leader"}, skipped: map[int]int{},
		sessions: []*sessionRun{{id: "s1", phase: 1, outcome: outcomeOK, took: time.Second}, {id: "s2", phase: 0, outcome: outcomeOK, took: time.Second}}}
	v, table := m.check()
	if v != 1 {
		t.Errorf("violations %d, want 1 (k2 twice)\n%s", v, table)
	}
	if !strings.Contains(table, "key k2: effect twice") {
		t.Errorf("the table does not name k2:\n%s", table)
	}

	if err := os.WriteFile(effects, []byte("s1 c1:1:0:\ns1 c1:1:0:\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	v, table = m.check()
	if v != 0 || !strings.Contains(table, "no keys") {
		t.Errorf("without keys: %d violations, want 0 and \"no keys\":\n%s", v, table)
	}
	for _, l := range strings.Split(table, "\n") {
		if strings.Contains(l, "kill-leader") && !regexp.MustCompile(`no keys\s+1\s`).MatchString(l) {
			t.Errorf("want one rerun in phase kill-leader: %q", l)
		}
	}
}
