package controllers_test

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/ziptrail/ziptrail/controllers"
	"github.com/ziptrail/ziptrail/internal/tools/envtest"
)

// The suite runs the real reconcilers in a manager against a real
// kube-apiserver and etcd with the Knative Service CRD installed. No Knative
// controller runs, so specs play its part by setting Service status.
var (
	env    *envtest.Env
	k8s    client.Client
	ctx    context.Context
	cancel context.CancelFunc
)

func TestControllers(t *testing.T) {
	RegisterFailHandler(Fail)
	// Gomega's 1 s default fails on a loaded 2-core CI machine (seen:
	// the Trigger controller's first reconcile took longer); a condition
	// that never holds still fails, later.
	SetDefaultEventuallyTimeout(30 * time.Second)
	SetDefaultEventuallyPollingInterval(50 * time.Millisecond)
	RunSpecs(t, "ziptrail controllers (envtest)")
}

var _ = BeforeSuite(func() {
	var err error
	env, err = envtest.Start()
	Expect(err).NotTo(HaveOccurred())
	k8s, err = client.New(env.Config, client.Options{Scheme: envtest.Scheme()})
	Expect(err).NotTo(HaveOccurred())

	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{
		Scheme:  envtest.Scheme(),
		Metrics: metricsserver.Options{BindAddress: "0"},
	})
	Expect(err).NotTo(HaveOccurred())
	// The operator under test has a Redis endpoint but no S3 one.
	Expect(controllers.Setup(mgr, controllers.Tiers{Redis: true, ControlAddr: testControlAddr}, nil)).To(Succeed())
	ctx, cancel = context.WithCancel(context.Background())
	go func() {
		defer GinkgoRecover()
		Expect(mgr.Start(ctx)).To(Succeed())
	}()
})

var _ = AfterSuite(func() {
	if cancel != nil {
		cancel()
	}
	if env != nil {
		Expect(env.Stop()).To(Succeed())
	}
})

func newNamespace() string {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "ctrl-"}}
	Expect(k8s.Create(ctx, ns)).To(Succeed())
	return ns.Name
}

// testControlAddr is the control Service the operator under test writes on
// every function's revision template.
const testControlAddr = "ziptrail-control.ziptrail-system.svc:9443"
