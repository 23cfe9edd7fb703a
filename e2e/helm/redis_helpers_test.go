package helm

import (
	"net"
	"strconv"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ziptrail/ziptrail/internal/localcluster"
	"github.com/ziptrail/ziptrail/internal/tools/servers"
)

// redisSvc is the Service in releaseNS (= localcluster.SystemNamespace)
// that leads to a redis-server on the host: the engine's checkpoints.
const redisSvc = "redis"

// hostRedis starts a redis-server on the host address (which the pods
// reach) behind Service redis in the operator's namespace, for a Describe
// whose release checkpoints its engine (tiers.redis.address = redisAddress);
// the Service goes with the Describe (DeferCleanup), the server with the
// spec tree.
func hostRedis() *servers.Redis {
	r := servers.StartRedisOn(GinkgoT(), cluster.State.HostIP)
	_, port, err := net.SplitHostPort(r.Addr)
	Expect(err).NotTo(HaveOccurred())
	target, err := strconv.Atoi(port)
	Expect(err).NotTo(HaveOccurred())
	Expect(localcluster.Advertise(ctx, cs, redisSvc, 6379, cluster.State.HostIP, target)).To(Succeed())
	DeferCleanup(func() {
		_ = cs.CoreV1().Services(releaseNS).Delete(ctx, redisSvc, metav1.DeleteOptions{})
		_ = cs.DiscoveryV1().EndpointSlices(releaseNS).Delete(ctx, redisSvc+"-host", metav1.DeleteOptions{})
	})
	return r
}

// redisAddress is the chart's tiers.redis.address for hostRedis.
const redisAddress = redisSvc + "." + releaseNS + ".svc.cluster.local:6379"
