package e2e

// queueProxyPackage is the queue-proxy every local pod runs. Knative's stock
// queue-proxy until queue-proxy-zl lands; the local runtime runs either.
const queueProxyPackage = "knative.dev/serving/cmd/queue"
