package podpick

import "testing"

func TestPickPrefersTheNodeThenTheLeastLoadedWithRoom(t *testing.T) {
	pods := []Pod{{"a:8012", "n1"}, {"b:8012", "n2"}, {"c:8012", "n2"}}
	// The producer's node first, its least loaded pod.
	if got := pick(pods, 0, "n2", map[string]int{"b:8012": 3, "c:8012": 1}); got != "c:8012" {
		t.Fatalf("on n2: %s, want c", got)
	}
	// The producer's node full (containerConcurrency 1): elsewhere.
	if got := pick(pods, 1, "n2", map[string]int{"b:8012": 1, "c:8012": 1}); got != "a:8012" {
		t.Fatalf("n2 full: %s, want a", got)
	}
	// Everything full: none, the route (the activator) holds it.
	if got := pick(pods, 1, "", map[string]int{"a:8012": 1, "b:8012": 1, "c:8012": 1}); got != "" {
		t.Fatalf("all full: %s, want none", got)
	}
	// Unknown node: two random choices, the less loaded; never a full one.
	for range 100 {
		if got := pick(pods, 2, "n9", map[string]int{"a:8012": 2, "b:8012": 2}); got != "c:8012" {
			t.Fatalf("two full: %s, want c", got)
		}
	}
}

func TestInflightCountsUntilDone(t *testing.T) {
	var f Inflight
	pods := []Pod{{"a:8012", "n1"}}
	addr, done := f.Pick(pods, 1, "")
	if addr != "a:8012" {
		t.Fatalf("first pick: %q", addr)
	}
	if again, _ := f.Pick(pods, 1, ""); again != "" {
		t.Fatalf("a pod at its concurrency was picked: %q", again)
	}
	done()
	done() // once only
	if again, done2 := f.Pick(pods, 1, ""); again != "a:8012" {
		t.Fatalf("after done: %q", again)
	} else {
		done2()
	}
	if len(f.n) != 0 {
		t.Fatalf("counts left: %v", f.n)
	}
}
