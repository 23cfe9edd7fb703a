package nodedir

import (
	"os"
	"path/filepath"
	"testing"
)

func TestPrepare(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "a", "node")
	if err := Prepare(dir); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode()&(os.ModeSticky|os.ModePerm) != Mode {
		t.Fatalf("mode %v, want %v", st.Mode(), Mode)
	}
}
