package main

import (
	"bufio"
	"os"
	"os/exec"
	"testing"
)

// TestTreeCPU: a child process that burned a known amount of CPU (0.3 s
// of its own, by its own clock) is counted under its command in this
// process's tree, and measureIdle's figures are consistent.
func TestTreeCPU(t *testing.T) {
	c0, _, err := treeCPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("python3", "-c", `import sys, time
t = time.process_time()
while time.process_time() - t < 0.3:
    pass
print("burned", flush=True)
sys.stdin.read()`)
	stdin, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { stdin.Close(); _ = cmd.Wait() }()
	if !bufio.NewScanner(out).Scan() {
		t.Fatal("the child did not report")
	}
	c1, n, err := treeCPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	// /proc's times tick at 10 ms
	if got := c1["python3"] - c0["python3"]; got < 0.28 {
		t.Errorf("the child's CPU in the tree: %.3f s, it burned 0.3 s", got)
	}
	if n < 2 {
		t.Errorf("%d processes in the tree, want this one and the child", n)
	}
	m, err := measureIdle(0, "test")
	if err != nil {
		t.Fatal(err)
	}
	if m.BackgroundCores < 0 || m.Processes < 2 || m.Seconds < 0 {
		t.Errorf("measureIdle: %+v", m)
	}
}
