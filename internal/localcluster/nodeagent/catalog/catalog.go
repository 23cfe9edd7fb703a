// Package catalog maps container image references to local processes: the
// node agent has no container runtime, so an image is "pulled" by looking it
// up in a catalog file that says which program runs for it, in which working
// directory and with which environment. The entrypoint is a Go package built
// on demand from the catalog's module (cached by package), an absolute path,
// or a command found on PATH.
//
// The file format (YAML):
//
//	root: ../..                 # optional: the directory relative paths are resolved against
//	                            # (relative to the catalog file; default: the catalog's directory)
//	images:
//	  - image: ziptrail.dev/e2e/echo:latest
//	    goPackage: ./e2e/images/echo   # built with `go build` in root, cached in the state dir
//	  - image: ghcr.io/ziptrail/examples-wordcount:latest
//	    entrypoint: [python3, wordcount.py]   # absolute path or a command on PATH
//	    args: []                              # default arguments (the image's CMD)
//	    workingDir: examples/wordcount        # relative to root, or absolute
//	    env: [{name: PYTHONPATH, value: ../../sdk/python}]
//
// As with a container runtime, a container's `command` replaces the
// entrypoint (and drops the default args), its `args` replace the default
// args, and its `env` is applied on top of the image's env. References match
// after normalisation: a missing tag means `:latest`, a digest (`@sha256:…`)
// is ignored, and an entry written without a tag matches every tag.
package catalog

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"

	"sigs.k8s.io/yaml"
)

// EnvVar is one variable of an image's environment.
type EnvVar struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

// Image is one catalog entry.
type Image struct {
	Image      string   `json:"image"`
	GoPackage  string   `json:"goPackage,omitempty"`
	Entrypoint []string `json:"entrypoint,omitempty"`
	Args       []string `json:"args,omitempty"`
	WorkingDir string   `json:"workingDir,omitempty"`
	Env        []EnvVar `json:"env,omitempty"`
}

type file struct {
	Root   string  `json:"root,omitempty"`
	Images []Image `json:"images"`
}

// Catalog is a loaded catalog file.
type Catalog struct {
	Path   string // the catalog file
	Root   string // absolute directory relative paths are resolved against
	images []Image
	binDir string

	mu     sync.Mutex
	builds map[string]*build
}

type build struct {
	done chan struct{}
	path string
	err  error
}

// ErrNotFound is returned (wrapped) for an image the catalog does not list.
var ErrNotFound = errors.New("image not in the catalog")

// Load reads a catalog file. Go packages are built into binDir.
func Load(path, binDir string) (*Catalog, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, err
	}
	data, err := os.ReadFile(abs)
	if err != nil {
		return nil, fmt.Errorf("read image catalog: %w", err)
	}
	var f file
	if err := yaml.UnmarshalStrict(data, &f); err != nil {
		return nil, fmt.Errorf("image catalog %s: %w", abs, err)
	}
	root := filepath.Dir(abs)
	if f.Root != "" {
		if filepath.IsAbs(f.Root) {
			root = filepath.Clean(f.Root)
		} else {
			root = filepath.Join(root, f.Root)
		}
	}
	seen := map[string]bool{}
	for i, img := range f.Images {
		if img.Image == "" {
			return nil, fmt.Errorf("image catalog %s: entry %d has no image", abs, i)
		}
		if (img.GoPackage == "") == (len(img.Entrypoint) == 0) {
			return nil, fmt.Errorf("image catalog %s: image %s needs exactly one of goPackage or entrypoint", abs, img.Image)
		}
		key := normalize(img.Image)
		if seen[key] {
			return nil, fmt.Errorf("image catalog %s: image %s is listed twice", abs, img.Image)
		}
		seen[key] = true
	}
	return &Catalog{Path: abs, Root: root, images: f.Images, binDir: binDir, builds: map[string]*build{}}, nil
}

// Lookup finds the entry for an image reference.
func (c *Catalog) Lookup(ref string) (Image, error) {
	want := normalize(ref)
	repo := repository(want)
	var byRepo *Image
	for i, img := range c.images {
		have := normalize(img.Image)
		if have == want {
			return img, nil
		}
		if !hasTag(img.Image) && repository(have) == repo {
			byRepo = &c.images[i]
		}
	}
	if byRepo != nil {
		return *byRepo, nil
	}
	return Image{}, fmt.Errorf("%w: %q is not listed in %s; add an entry for it (see docs/local-cluster.md)", ErrNotFound, ref, c.Path)
}

// Process is what to run for a container.
type Process struct {
	Argv       []string
	WorkingDir string
	Env        []EnvVar // the image's env; the container's env goes on top
	Built      bool     // the entrypoint was built from a Go package just now
}

// Resolve returns the process for a container of the image with the pod
// spec's command, args and workingDir (empty when not set). It builds a Go
// package entrypoint on first use; concurrent callers wait for one build.
func (c *Catalog) Resolve(ctx context.Context, img Image, command, args []string, workingDir string) (Process, error) {
	var p Process
	entry := img.Entrypoint
	if img.GoPackage != "" {
		bin, built, err := c.goBinary(ctx, img.GoPackage)
		if err != nil {
			return p, err
		}
		entry, p.Built = []string{bin}, built
	}
	switch {
	case len(command) > 0:
		p.Argv = append(append([]string{}, command...), args...)
	case len(args) > 0:
		p.Argv = append(append([]string{}, entry...), args...)
	default:
		p.Argv = append(append([]string{}, entry...), img.Args...)
	}
	p.WorkingDir = workingDir
	if p.WorkingDir == "" {
		p.WorkingDir = c.abs(img.WorkingDir)
	}
	p.Env = img.Env
	return p, nil
}

func (c *Catalog) abs(dir string) string {
	if dir == "" {
		return c.Root
	}
	if filepath.IsAbs(dir) {
		return dir
	}
	return filepath.Join(c.Root, dir)
}

// Present reports whether an image can start without a build (it is not a
// Go package, or its binary is cached).
func (c *Catalog) Present(img Image) bool {
	if img.GoPackage == "" {
		return true
	}
	_, err := os.Stat(c.binPath(img.GoPackage))
	return err == nil
}

func (c *Catalog) binPath(pkg string) string {
	return filepath.Join(c.binDir, strings.NewReplacer("/", "_", ".", "_", "@", "_").Replace(strings.TrimPrefix(pkg, "./")))
}

// goBinary returns the cached binary of a Go package, building it when absent.
func (c *Catalog) goBinary(ctx context.Context, pkg string) (string, bool, error) {
	out := c.binPath(pkg)
	c.mu.Lock()
	b, ok := c.builds[pkg]
	if !ok || (isDone(b.done) && b.err != nil) { // err is only read once the build is done
		b = &build{done: make(chan struct{}), path: out}
		c.builds[pkg] = b
		c.mu.Unlock()
		b.err = c.goBuild(context.WithoutCancel(ctx), pkg, out)
		close(b.done)
		return out, b.err == nil, b.err
	}
	c.mu.Unlock()
	select {
	case <-b.done:
		return b.path, false, b.err
	case <-ctx.Done():
		return "", false, ctx.Err()
	}
}

func isDone(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func (c *Catalog) goBuild(ctx context.Context, pkg, out string) error {
	if _, err := os.Stat(out); err == nil {
		return nil // cached by an earlier run
	}
	if err := os.MkdirAll(c.binDir, 0o755); err != nil {
		return err
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		return fmt.Errorf("build Go package %s for the image catalog: the go tool is not on PATH: %w", pkg, err)
	}
	tmp := out + ".tmp"
	cmd := exec.CommandContext(ctx, goBin, "build", "-o", tmp, pkg)
	cmd.Dir = c.Root
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s (in %s): %w: %s", pkg, c.Root, err, strings.TrimSpace(string(b)))
	}
	return os.Rename(tmp, out)
}

// normalize drops a digest and adds the default tag.
func normalize(ref string) string {
	if i := strings.Index(ref, "@"); i >= 0 {
		ref = ref[:i]
	}
	if !hasTag(ref) {
		ref += ":latest"
	}
	return ref
}

func hasTag(ref string) bool {
	if i := strings.Index(ref, "@"); i >= 0 {
		ref = ref[:i]
	}
	return strings.LastIndex(ref, ":") > strings.LastIndex(ref, "/")
}

func repository(ref string) string {
	if i := strings.LastIndex(ref, ":"); i > strings.LastIndex(ref, "/") {
		return ref[:i]
	}
	return ref
}
