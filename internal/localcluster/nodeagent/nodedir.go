package nodeagent

import (
	"fmt"
	"path/filepath"

	"github.com/ziptrail/ziptrail/internal/dataplane/samenode"
	"github.com/ziptrail/ziptrail/internal/nodedir"
)

// nodeDirs gives each node of the agent its own ziptrail node directory
// (samenode.DefaultDir, the hostPath ziptrail's pod webhook mounts into
// queue-proxy): on a real cluster every node has its own, here the nodes
// share one host, so the hostPath resolves under the agent's state
// directory, per node. It is prepared as the chart's node-dir DaemonSet
// prepares it (nodedir.Prepare: mode 1733).
func nodeDirs(stateDir, node string) (map[string]string, error) {
	dir := filepath.Join(stateDir, "nodes", node, "ziptrail-node")
	if err := nodedir.Prepare(dir); err != nil {
		return nil, fmt.Errorf("node %s: ziptrail node directory: %w", node, err)
	}
	return map[string]string{samenode.DefaultDir: dir}, nil
}
