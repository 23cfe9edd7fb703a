package archtest

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
)

func theGraph(t *testing.T) *graph {
	t.Helper()
	g, err := moduleGraph()
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// TestEveryPackageHasAWing checks that every package of the module is
// placed in a wing (a new package is placed deliberately) and that the
// table has no row left over from a move. With -v it prints the house.
func TestEveryPackageHasAWing(t *testing.T) {
	g := theGraph(t)
	for _, p := range g.local {
		if _, ok := g.wings[p]; !ok {
			t.Errorf("%s is in no wing: add a row to placements in internal/archtest/layout_test.go (the layout is issue 34's)", p)
		}
	}

	patterns := map[string]bool{}
	placing := map[string]int{} // row pattern → packages it places
	for _, p := range g.local {
		placing[g.placedBy[p].pattern]++
	}
	for _, pl := range placements {
		if patterns[pl.pattern] {
			t.Errorf("placements: %q has two rows", pl.pattern)
		}
		patterns[pl.pattern] = true
		if pl.moveTo != "" && placing[pl.pattern] == 0 {
			t.Errorf("placements: row %q places no package: moved to %s? Then its home's row places it: delete this row", pl.pattern, pl.moveTo)
		}
	}

	if !testing.Verbose() {
		return
	}
	byWing := map[wing][]string{}
	toMove := 0
	for _, p := range g.local {
		w, pl := g.wings[p], g.placedBy[p]
		if pl.moveTo != "" {
			p += " (→ " + destination(p, pl) + ")"
			toMove++
		}
		byWing[w] = append(byWing[w], p)
	}
	var house strings.Builder
	for _, w := range slices.Sorted(maps.Keys(byWing)) {
		name := string(w)
		if w == "" {
			name = "in no wing"
		}
		fmt.Fprintf(&house, "\n%s (production: %v):\n\t%s", name, w.production(), strings.Join(byWing[w], "\n\t"))
	}
	t.Logf("%d packages, %d not yet at their home:%s", len(g.local), toMove, house.String())
}

// destination is where a package placed by a row with moveTo goes: a
// tree's package keeps its path under the tree's new root.
func destination(path string, pl placement) string {
	root, tree := strings.CutSuffix(pl.pattern, "/...")
	if !tree {
		return pl.moveTo
	}
	return pl.moveTo + strings.TrimPrefix(path, root)
}

// TestLayoutRules checks each rule of the layout over the module's
// production imports, less the listed exceptions, and that every
// exception is still needed.
func TestLayoutRules(t *testing.T) {
	g := theGraph(t)

	byRule := map[string]map[edge]bool{}
	for _, e := range exceptions {
		if !slices.ContainsFunc(rules, func(r rule) bool { return r.id == e.rule }) {
			t.Errorf("exception %s → %s names no rule: %q", e.from, e.to, e.rule)
		}
		if e.reason == "" || e.issue == "" {
			t.Errorf("exception %s → %s (%s) needs a reason and the issue it is to be fixed under", e.from, e.to, e.rule)
		}
		if byRule[e.rule] == nil {
			byRule[e.rule] = map[edge]bool{}
		}
		byRule[e.rule][edge{e.from, e.to}] = true
	}

	for i := range rules {
		r := &rules[i]
		t.Run(r.id, func(t *testing.T) {
			found, used := g.check(r, byRule[r.id])
			for _, v := range found {
				t.Error(v)
			}
			for _, x := range exceptions {
				e := edge{x.from, x.to}
				if x.rule != r.id || used[e] {
					continue
				}
				why := "it no longer crosses the rule's boundary"
				if !slices.Contains(g.imports[e.from], e.to) {
					why = "there is no such import any more"
				}
				t.Errorf("exception %s → %s is no longer needed (%s): delete it from exceptions in layout_test.go, or, if a package has moved, update its paths", e.from, e.to, why)
			}
		})
	}
}
