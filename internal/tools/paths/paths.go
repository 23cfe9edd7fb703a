// Package paths finds the repository's and the installed tools' places:
// the repository root, and the binaries and cache hack/install-deps.sh
// installs.
package paths

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
)

// RepoRoot returns the repository root: found from this source file when the
// sources are on disk (tests, go run), else from the working directory up.
func RepoRoot() string {
	if _, file, _, ok := runtime.Caller(0); ok {
		root := filepath.Join(filepath.Dir(file), "..", "..", "..")
		if _, err := os.Stat(filepath.Join(root, "config", "crd", "bases")); err == nil {
			return root
		}
	}
	dir, err := os.Getwd()
	if err != nil {
		return "."
	}
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "config", "crd", "bases")); err == nil {
			return d
		}
		if filepath.Dir(d) == d {
			return dir
		}
	}
}

// FindBinary looks for a server binary on PATH, then in $ZIPTRAIL_CACHE/bin
// (default ~/.cache/ziptrail/bin), where hack/install-deps.sh builds MinIO
// and CoreDNS. It returns "" when neither has it.
func FindBinary(name string) string {
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	p := filepath.Join(CacheDir(), "bin", name)
	if _, err := os.Stat(p); err != nil {
		return ""
	}
	return p
}

// CacheDir is hack/install-deps.sh's cache: $ZIPTRAIL_CACHE, default
// ~/.cache/ziptrail.
func CacheDir() string {
	if cache := os.Getenv("ZIPTRAIL_CACHE"); cache != "" {
		return cache
	}
	home, _ := os.UserHomeDir()
	return filepath.Join(home, ".cache", "ziptrail")
}
