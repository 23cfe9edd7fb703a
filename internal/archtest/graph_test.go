package archtest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
)

// A pkg is a package as the rules see it.
type pkg struct {
	path  string // relative to the module for the module's own packages, else the import path
	local bool   // one of the module's packages
	wing  wing   // its wing; empty outside the module and for an unplaced package
}

// A rule binds some of the module's packages and forbids them to reach
// some packages, directly or through any chain of imports.
type rule struct {
	id      string
	summary string
	binds   func(pkg) bool
	// forbids reports whether a package is forbidden, and what it is (a
	// wing, "HTTP", ...) for the message.
	forbids func(pkg) (what string, forbidden bool)
	// passes, if set, marks packages the rule does not look inside: their
	// own imports are their business (the operator's pull, ref, store).
	passes func(pkg) bool
}

// An exception lets one direct import cross one rule's boundary.
type exception struct {
	rule     string
	from, to string // relative to the module
	reason   string
	issue    string
}

// An edge is one direct import.
type edge struct{ from, to string }

func inWing(w wing) func(pkg) bool { return func(p pkg) bool { return p.wing == w } }

func wingIn(ws ...wing) func(pkg) (string, bool) {
	return func(p pkg) (string, bool) { return string(p.wing), p.local && slices.Contains(ws, p.wing) }
}

// under reports whether path is root or a package under it.
func under(path, root string) bool {
	return path == root || strings.HasPrefix(path, root+"/")
}

// A graph is the module's packages and everything they import, test files
// left out.
type graph struct {
	imports  map[string][]string // package → its direct imports, sorted
	local    []string            // the module's packages, sorted
	isLocal  map[string]bool
	wings    map[string]wing      // the module's placed packages
	placedBy map[string]placement // the row that placed each
}

// newGraph builds a graph from each package's direct imports and the
// module's packages; the module's packages are named by their path
// relative to the module.
func newGraph(imports map[string][]string, local []string) *graph {
	g := &graph{imports: imports, isLocal: map[string]bool{}, wings: map[string]wing{}, placedBy: map[string]placement{}}
	g.local = slices.Sorted(slices.Values(local))
	for _, p := range g.local {
		g.isLocal[p] = true
		if pl, ok := place(p); ok {
			g.wings[p], g.placedBy[p] = pl.wing, pl
		}
	}
	for _, imps := range imports {
		slices.Sort(imps)
	}
	return g
}

func (g *graph) pkg(path string) pkg {
	return pkg{path: path, local: g.isLocal[path], wing: g.wings[path]}
}

// place finds the row of placements that places a package: the longest
// matching pattern, a package's own row before its tree's.
func place(path string) (placement, bool) {
	var best placement
	bestLen := -1
	for _, pl := range placements {
		root, tree := strings.CutSuffix(pl.pattern, "/...")
		if !(path == root || tree && strings.HasPrefix(path, root+"/")) {
			continue
		}
		n := 2 * len(root)
		if !tree {
			n++
		}
		if n > bestLen {
			best, bestLen = pl, n
		}
	}
	return best, bestLen >= 0
}

// A violation is one forbidden import, with the shortest chain to it from
// a package the rule binds.
type violation struct {
	rule     *rule
	chain    []string // from the bound package (the importer) to the forbidden one
	what     string   // what the forbidden package is
	alsoFrom []string // other bound packages that reach the same forbidden import
	wingOf   wing     // the importer's wing
}

func (v violation) String() string {
	importer, imported := v.chain[0], v.chain[len(v.chain)-1]
	if v.what == "" {
		v.what = "in no wing"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s: forbidden import %s → %s\n", v.rule.summary, v.chain[len(v.chain)-2], imported)
	fmt.Fprintf(&b, "\timporter: %s (%s)\n", importer, v.wingOf)
	fmt.Fprintf(&b, "\timported: %s (%s)\n", imported, v.what)
	fmt.Fprintf(&b, "\tchain:    %s\n", strings.Join(v.chain, " → "))
	if len(v.alsoFrom) > 0 {
		fmt.Fprintf(&b, "\talso reached from: %s\n", strings.Join(v.alsoFrom, ", "))
	}
	fmt.Fprintf(&b, "\t(remove the import; if it must stay for now, add it to exceptions in layout_test.go with its reason and issue)")
	return b.String()
}

// check walks the imports of every package r binds, breadth first, and
// returns each forbidden import reached (once, with the shortest chain)
// and the excepted imports it met. It does not look inside a forbidden
// package, nor across an excepted import, nor, from production code,
// inside the module's code that is not production (or not placed): the
// production rule reports the import of that.
func (g *graph) check(r *rule, excepted map[edge]bool) (found []violation, used map[edge]bool) {
	used = map[edge]bool{}
	byEdge := map[edge]*violation{}
	for _, bound := range g.local {
		if !r.binds(g.pkg(bound)) {
			continue
		}
		parent := map[string]string{bound: ""}
		queue := []string{bound}
		for len(queue) > 0 {
			from := queue[0]
			queue = queue[1:]
			for _, to := range g.imports[from] {
				p := g.pkg(to)
				if what, forbidden := r.forbids(p); forbidden {
					e := edge{from, to}
					if excepted[e] {
						used[e] = true
						continue
					}
					chain := append(chainTo(parent, from), to)
					v := byEdge[e]
					switch {
					case v == nil:
						byEdge[e] = &violation{rule: r, chain: chain, what: what, wingOf: g.wings[bound]}
					case len(chain) < len(v.chain):
						v.alsoFrom = append(v.alsoFrom, v.chain[0])
						v.chain, v.wingOf = chain, g.wings[bound]
					default:
						v.alsoFrom = append(v.alsoFrom, bound)
					}
					continue
				}
				if _, seen := parent[to]; seen {
					continue
				}
				parent[to] = from
				if r.passes != nil && r.passes(p) || p.local && !p.wing.production() && g.wings[bound].production() {
					continue
				}
				queue = append(queue, to)
			}
		}
	}
	for _, v := range byEdge {
		slices.Sort(v.alsoFrom)
		found = append(found, *v)
	}
	slices.SortFunc(found, func(a, b violation) int {
		return strings.Compare(strings.Join(a.chain, " "), strings.Join(b.chain, " "))
	})
	return found, used
}

// chainTo is the path from the walk's start to pkg.
func chainTo(parent map[string]string, pkg string) []string {
	var chain []string
	for p := pkg; p != ""; p = parent[p] {
		chain = append(chain, p)
	}
	slices.Reverse(chain)
	return chain
}

// moduleGraph lists the module once per test binary.
var moduleGraph = sync.OnceValues(loadGraph)

// listed is the part of `go list -json` the graph needs.
type listed struct {
	ImportPath string
	Imports    []string
	Module     *struct {
		Path string
		Main bool
	}
	Error *struct{ Err string }
}

// loadGraph runs `go list -deps -json ./...` at the module's root (test
// files are not listed) and builds the graph. It needs no network: the
// module proxy is off, so a missing module is an error, not a download.
func loadGraph() (*graph, error) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		return nil, fmt.Errorf("the go command is needed to list the packages: %w", err)
	}
	env := append(os.Environ(), "GOPROXY=off", "GOTOOLCHAIN=local")
	out, err := run(goTool, "", env, "env", "GOMOD")
	if err != nil {
		return nil, err
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return nil, errors.New("go env GOMOD: not inside a module")
	}
	out, err = run(goTool, filepath.Dir(gomod), env, "list", "-e", "-deps", "-json=ImportPath,Imports,Module,Error", "./...")
	if err != nil {
		return nil, err
	}
	var pkgs []listed
	module := ""
	for dec := json.NewDecoder(bytes.NewReader(out)); ; {
		var p listed
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			return nil, fmt.Errorf("reading go list's output: %w", err)
		}
		if p.Module != nil && p.Module.Main {
			module = p.Module.Path
		}
		pkgs = append(pkgs, p)
	}
	if module == "" {
		return nil, errors.New("go list ./... listed none of the module's packages")
	}
	rel := func(path string) string {
		if path == module {
			return "."
		}
		if r, ok := strings.CutPrefix(path, module+"/"); ok {
			return r
		}
		return path
	}
	imports := map[string][]string{}
	var local, broken []string
	for _, p := range pkgs {
		if p.Error != nil {
			broken = append(broken, fmt.Sprintf("%s: %s", p.ImportPath, p.Error.Err))
		}
		path := rel(p.ImportPath)
		if path != p.ImportPath {
			local = append(local, path)
		}
		for _, imp := range p.Imports {
			imports[path] = append(imports[path], rel(imp))
		}
	}
	if len(broken) > 0 {
		return nil, fmt.Errorf("go list could not load every package, so the layout cannot be checked:\n\t%s", strings.Join(broken, "\n\t"))
	}
	for _, p := range pkgs {
		if slices.Contains(local, p.ImportPath) {
			return nil, fmt.Errorf("the module's package %s has the same relative path as the outside package %s", module+"/"+p.ImportPath, p.ImportPath)
		}
	}
	return newGraph(imports, local), nil
}

func run(goTool, dir string, env []string, args ...string) ([]byte, error) {
	cmd := exec.Command(goTool, args...)
	cmd.Dir, cmd.Env = dir, env
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return out, nil
}
