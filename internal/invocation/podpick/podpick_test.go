package podpick

import "testing"

func TestPickPrefersTheNodeThenTheLessLoaded(t *testing.T) {
	pods := []Pod{{"a:8012", "n1"}, {"b:8012", "n2"}, {"c:8012", "n2"}}
	// The producer's node first, its least loaded pod, however loaded.
	if got := pick(pods, "n2", map[string]int{"b:8012": 3, "c:8012": 1}); got != "c:8012" {
		t.Fatalf("on n2: %s, want c", got)
	}
	// Unknown node: the less loaded of two random choices, so the busy
	// pod only when both draws are it (1 in 4 with two pods).
	two := []Pod{{"busy:8012", "n1"}, {"idle:8012", "n1"}}
	idle := 0
	for range 1000 {
		if pick(two, "n9", map[string]int{"busy:8012": 5}) == "idle:8012" {
			idle++
		}
	}
	if idle < 650 {
		t.Fatalf("the idle pod was picked %d times of 1000, want about 750", idle)
	}
}

func TestInflightCountsUntilDone(t *testing.T) {
	var f Inflight
	pods := []Pod{{"a:8012", "n1"}, {"b:8012", "n1"}}
	addr, done := f.Pick(pods, "n1")
	if f.n[addr] != 1 {
		t.Fatalf("in flight after a pick: %v", f.n)
	}
	// The other pod is now the least loaded on the node.
	other, done2 := f.Pick(pods, "n1")
	if other == addr {
		t.Fatalf("picked %s twice while the other pod was idle", addr)
	}
	done()
	done() // once only
	done2()
	if len(f.n) != 0 {
		t.Fatalf("counts left: %v", f.n)
	}
	if got, _ := f.Pick(nil, "n1"); got != "" {
		t.Fatalf("no pods: %q", got)
	}
}
