package sandbox

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A mount point this agent created is not removed while a process in
// another mount namespace (another agent's container) has something
// mounted there: removing it would detach that container's volume.
func TestCreatedMountPointKeptWhileMountedElsewhere(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("needs root (mount namespaces)")
	}
	dir := t.TempDir()
	mp := filepath.Join(dir, "created", "mp")
	if err := os.MkdirAll(mp, 0o755); err != nil {
		t.Fatal(err)
	}
	log := filepath.Join(dir, "c.created")
	if err := os.WriteFile(log, []byte(mp+"\n"+filepath.Dir(mp)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// Another "container": its own mount namespace with a tmpfs on mp.
	other := exec.Command("unshare", "--mount", "--propagation", "private", "sh", "-c",
		"mount -t tmpfs none "+mp+" && echo mounted && exec sleep 60")
	out, err := other.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = other.Process.Kill(); _ = other.Wait() })
	buf := make([]byte, 16)
	if n, _ := out.Read(buf); !strings.Contains(string(buf[:n]), "mounted") {
		t.Fatalf("the other namespace did not mount: %q", buf[:n])
	}

	addPending(log)
	removePending()
	if _, err := os.Stat(mp); err != nil {
		t.Fatalf("mount point removed while mounted in another namespace: %v", err)
	}
	// Once nobody mounts there any more, it goes.
	_ = other.Process.Kill()
	_ = other.Wait()
	deadline := time.Now().Add(10 * time.Second)
	for {
		removePending()
		if _, err := os.Stat(filepath.Dir(mp)); os.IsNotExist(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("created mount points not removed after the other namespace ended")
		}
		time.Sleep(100 * time.Millisecond)
	}
}
