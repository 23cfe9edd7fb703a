package archtest

import (
	"slices"
	"strings"
	"testing"
)

// A small made-up module, placed by the real table, with the real rules:
// a data-plane package reaches the operator through another, the engine
// reaches net/http through a shared leaf, the operator is a client of pull.
func fakeGraph() *graph {
	return newGraph(map[string][]string{
		"internal/dataplane/a":           {"internal/dataplane/b"},
		"internal/dataplane/b":           {"internal/operator/orchestrator"},
		"internal/operator/orchestrator": {"internal/dataplane/pull"},
		"internal/dataplane/pull":        {"internal/dataplane/streamio"},
		"internal/engine":                {"internal/invocation"},
		"internal/invocation":            {"net/http"},
		"net/http":                       {"net/http/internal"},
	}, []string{
		"internal/dataplane/a", "internal/dataplane/b", "internal/dataplane/pull", "internal/dataplane/streamio",
		"internal/operator/orchestrator", "internal/engine", "internal/invocation",
	})
}

func ruleByID(t *testing.T, id string) *rule {
	t.Helper()
	for i := range rules {
		if rules[i].id == id {
			return &rules[i]
		}
	}
	t.Fatalf("no rule %q", id)
	return nil
}

func TestCheckReportsTheImportAndItsChain(t *testing.T) {
	g := fakeGraph()

	found, _ := g.check(ruleByID(t, ruleDataPlane), nil)
	if len(found) != 1 {
		t.Fatalf("data plane → operator: %d violations, want 1: %v", len(found), found)
	}
	v := found[0]
	if want := []string{"internal/dataplane/b", "internal/operator/orchestrator"}; !slices.Equal(v.chain, want) {
		t.Errorf("chain %v, want the shortest, %v", v.chain, want)
	}
	if want := []string{"internal/dataplane/a"}; !slices.Equal(v.alsoFrom, want) {
		t.Errorf("also from %v, want %v", v.alsoFrom, want)
	}
	for _, want := range []string{
		"forbidden import internal/dataplane/b → internal/operator/orchestrator",
		"importer: internal/dataplane/b (data plane)",
		"imported: internal/operator/orchestrator (operator)",
		"chain:    internal/dataplane/b → internal/operator/orchestrator",
	} {
		if !strings.Contains(v.String(), want) {
			t.Errorf("message lacks %q:\n%s", want, v)
		}
	}

	found, _ = g.check(ruleByID(t, ruleEngine), nil)
	if len(found) != 1 || !slices.Equal(found[0].chain, []string{"internal/engine", "internal/invocation", "net/http"}) || found[0].what != "HTTP" {
		t.Errorf("engine → HTTP through a leaf: got %v", found)
	}

	if found, _ := g.check(ruleByID(t, ruleOperatorUse), nil); len(found) != 0 {
		t.Errorf("the operator using pull (which uses streamio) is allowed, got %v", found)
	}
}

func TestCheckHonoursExactExceptions(t *testing.T) {
	g := fakeGraph()
	crossing := edge{"internal/dataplane/b", "internal/operator/orchestrator"}

	found, used := g.check(ruleByID(t, ruleDataPlane), map[edge]bool{crossing: true})
	if len(found) != 0 || !used[crossing] {
		t.Errorf("excepted import: violations %v, used %v", found, used)
	}

	// An exception for another import excuses nothing and is not used.
	other := edge{"internal/dataplane/a", "internal/operator/orchestrator"}
	found, used = g.check(ruleByID(t, ruleDataPlane), map[edge]bool{other: true})
	if len(found) != 1 || used[other] {
		t.Errorf("unrelated exception: violations %v, used %v", found, used)
	}
}
