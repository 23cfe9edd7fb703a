package catalog

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
)

func load(t *testing.T, yaml string) *Catalog {
	t.Helper()
	dir := t.TempDir()
	path := filepath.Join(dir, "images.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := Load(path, filepath.Join(dir, "bin"))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestLookupNormalizesReferences(t *testing.T) {
	c := load(t, `
images:
  - image: example.dev/app
    entrypoint: [app]
  - image: example.dev/tool:v2
    entrypoint: [tool2]
  - image: localhost:5000/x
    entrypoint: [x]
`)
	for ref, want := range map[string]string{
		"example.dev/app":                   "app",
		"example.dev/app:v9":                "app", // untagged entry: every tag
		"example.dev/app@sha256:0123abcd":   "app",
		"example.dev/tool:v2":               "tool2",
		"example.dev/tool:v2@sha256:abcdef": "tool2",
		"localhost:5000/x":                  "x", // a registry port is not a tag
	} {
		img, err := c.Lookup(ref)
		if err != nil || img.Entrypoint[0] != want {
			t.Errorf("Lookup(%q) = %v, %v; want %s", ref, img.Entrypoint, err, want)
		}
	}
	for _, ref := range []string{"example.dev/tool:v1", "example.dev/tool", "example.dev/other", ""} {
		_, err := c.Lookup(ref)
		if !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), c.Path) {
			t.Errorf("Lookup(%q) = %v; want ErrNotFound naming the catalog", ref, err)
		}
	}
}

// As with a container runtime: command replaces the entrypoint and drops
// the default args; args replace the default args.
func TestResolveCommandAndArgs(t *testing.T) {
	c := load(t, `
root: /srv
images:
  - image: a
    entrypoint: [python3, fn.py]
    args: [serve]
    workingDir: examples/a
    env: [{name: X, value: "1"}]
`)
	img, _ := c.Lookup("a")
	for _, tc := range []struct {
		command, args, want []string
	}{
		{nil, nil, []string{"python3", "fn.py", "serve"}},
		{nil, []string{"count"}, []string{"python3", "fn.py", "count"}},
		{[]string{"sh", "-c"}, nil, []string{"sh", "-c"}},
		{[]string{"sh", "-c"}, []string{"echo"}, []string{"sh", "-c", "echo"}},
	} {
		p, err := c.Resolve(context.Background(), img, tc.command, tc.args, "")
		if err != nil || !reflect.DeepEqual(p.Argv, tc.want) {
			t.Errorf("Resolve(%v, %v) = %v, %v; want %v", tc.command, tc.args, p.Argv, err, tc.want)
		}
		if p.WorkingDir != "/srv/examples/a" || len(p.Env) != 1 {
			t.Errorf("workingDir %q env %v", p.WorkingDir, p.Env)
		}
	}
	p, _ := c.Resolve(context.Background(), img, nil, nil, "/elsewhere")
	if p.WorkingDir != "/elsewhere" {
		t.Errorf("the container's workingDir must win: %q", p.WorkingDir)
	}
}

func TestLoadRejectsBadCatalogs(t *testing.T) {
	for name, yaml := range map[string]string{
		"both":      "images: [{image: a, goPackage: ./x, entrypoint: [y]}]",
		"neither":   "images: [{image: a}]",
		"no image":  "images: [{entrypoint: [y]}]",
		"duplicate": "images: [{image: a, entrypoint: [y]}, {image: 'a:latest', entrypoint: [z]}]",
		"unknown":   "images: [{image: a, entrypoint: [y], entrypiont: [z]}]",
		"malformed": "images: [",
	} {
		dir := t.TempDir()
		path := filepath.Join(dir, "c.yaml")
		_ = os.WriteFile(path, []byte(yaml), 0o644)
		if _, err := Load(path, dir); err == nil || !strings.Contains(err.Error(), path) {
			t.Errorf("%s: Load = %v; want an error naming the file", name, err)
		}
	}
}

// A Go package is built once, into the cache, and a failed build is
// reported with the compiler's output.
func TestGoPackageBuild(t *testing.T) {
	if _, err := os.Stat("/usr/local/go/bin/go"); err != nil {
		if _, err := os.Stat(filepath.Join(os.Getenv("GOROOT"), "bin", "go")); err != nil {
			t.Skip("no go tool")
		}
	}
	dir := t.TempDir()
	write := func(p, s string) {
		_ = os.MkdirAll(filepath.Dir(filepath.Join(dir, p)), 0o755)
		if err := os.WriteFile(filepath.Join(dir, p), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("go.mod", "module example.dev/m\n\ngo 1.22\n")
	write("ok/main.go", "package main\nfunc main() {}\n")
	write("broken/main.go", "package main\nfunc main() { undefined() }\n")
	write("images.yaml", "images:\n  - {image: ok, goPackage: ./ok}\n  - {image: broken, goPackage: ./broken}\n")
	c, err := Load(filepath.Join(dir, "images.yaml"), filepath.Join(dir, "cache"))
	if err != nil {
		t.Fatal(err)
	}
	img, _ := c.Lookup("ok")
	p, err := c.Resolve(context.Background(), img, nil, nil, "")
	if err != nil || !p.Built || p.Argv[0] != filepath.Join(dir, "cache", "ok") {
		t.Fatalf("first resolve: %+v %v", p, err)
	}
	if p, err = c.Resolve(context.Background(), img, nil, nil, ""); err != nil || p.Built {
		t.Fatalf("second resolve must use the cache: %+v %v", p, err)
	}
	// Concurrent first uses wait for one build.
	write("ok2/main.go", "package main\nfunc main() {}\n")
	c.images = append(c.images, Image{Image: "ok2", GoPackage: "./ok2"})
	img2, _ := c.Lookup("ok2")
	var wg sync.WaitGroup
	built := make(chan bool, 3)
	for range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p, err := c.Resolve(context.Background(), img2, nil, nil, "")
			if err != nil {
				t.Error(err)
			}
			built <- p.Built
		}()
	}
	wg.Wait()
	close(built)
	n := 0
	for b := range built {
		if b {
			n++
		}
	}
	if n != 1 {
		t.Errorf("%d of 3 concurrent resolves built the package; want 1", n)
	}
	img, _ = c.Lookup("broken")
	if _, err := c.Resolve(context.Background(), img, nil, nil, ""); err == nil || !strings.Contains(err.Error(), "undefined") {
		t.Fatalf("broken package: %v", err)
	}
}
