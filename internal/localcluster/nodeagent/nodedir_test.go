package nodeagent

import (
	"os"
	"testing"

	"github.com/ziptrail/ziptrail/internal/dataplane/samenode"
	"github.com/ziptrail/ziptrail/internal/nodedir"
)

// Each node of one agent gets its own same-node directory, mode 1733.
func TestNodeDirs(t *testing.T) {
	state := t.TempDir()
	a, err := nodeDirs(state, "node-a")
	if err != nil {
		t.Fatal(err)
	}
	b, err := nodeDirs(state, "node-b")
	if err != nil {
		t.Fatal(err)
	}
	da, db := a[samenode.DefaultDir], b[samenode.DefaultDir]
	if da == "" || da == db {
		t.Fatalf("node directories %q and %q", da, db)
	}
	for _, d := range []string{da, db} {
		st, err := os.Stat(d)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode()&(os.ModeSticky|os.ModePerm) != nodedir.Mode {
			t.Errorf("%s: mode %v", d, st.Mode())
		}
	}
}
