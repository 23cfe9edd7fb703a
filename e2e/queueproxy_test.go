package e2e

// queueProxyPackage is the queue-proxy every local pod runs.
const queueProxyPackage = "github.com/ziptrail/ziptrail/cmd/queue-proxy-zl"
