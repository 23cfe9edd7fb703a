package nodeagent

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestExpand(t *testing.T) {
	vars := map[string]string{"A": "x", "B": "$(A)"}
	for in, want := range map[string]string{
		"$(A)-$(A)": "x-x", "$(MISSING)": "$(MISSING)", "$$(A)": "$(A)", "$(B)": "$(A)",
		"plain": "plain", "$(": "$(", "a$": "a$", "$x": "$x",
	} {
		if got := expand(in, vars); got != want {
			t.Errorf("expand(%q) = %q; want %q", in, got, want)
		}
	}
}

func TestSeekTail(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		content string
		n       int
		want    string
	}{
		{"a\nb\nc\n", 2, "b\nc\n"},
		{"a\nb\nc", 2, "b\nc"},
		{"a\nb\nc\n", 5, "a\nb\nc\n"},
		{"a\nb\nc\n", 0, "a\nb\nc\n"},
		{"", 3, ""},
		{strings.Repeat("x", 100000) + "\nlast\n", 1, "last\n"},
	} {
		path := filepath.Join(dir, "log")
		if err := os.WriteFile(path, []byte(tc.content), 0o644); err != nil {
			t.Fatal(err)
		}
		f, _ := os.Open(path)
		if err := seekTail(f, tc.n); err != nil {
			t.Fatal(err)
		}
		b := make([]byte, len(tc.content)+1)
		n, _ := f.Read(b)
		f.Close()
		if string(b[:n]) != tc.want {
			t.Errorf("tail %d of %q = %q; want %q", tc.n, tc.content[:min(len(tc.content), 20)], b[:n], tc.want)
		}
	}
}
