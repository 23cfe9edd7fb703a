// Package nodedir is the same-node directory's contract on a node, shared
// by whoever makes it (the chart's node-dir DaemonSet through
// `operator node-dir`, the local cluster's node agent) and the data plane
// that uses it (internal/dataplane/samenode): its mode and how it is
// made.
package nodedir

import "os"

// Mode is the node directory's mode: every queue-proxy (whatever its
// uid) may create its socket there, none may list the others' names or
// remove a socket it does not own (sticky).
const Mode = os.ModeSticky | 0o733

// Prepare creates the node directory with Mode (the node agent on the
// local cluster, the chart's node-dir DaemonSet on a real one: the
// kubelet's DirectoryOrCreate makes it 0755 root, where a non-root
// queue-proxy cannot create its socket).
func Prepare(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	return os.Chmod(dir, Mode)
}
