// Command testenv runs a real control plane for the Python SDK's tests: a
// kube-apiserver and etcd (envtest, from $KUBEBUILDER_ASSETS) with the
// ziptrail and Knative Serving CRDs installed, and writes an admin
// kubeconfig. With --gateway it also runs the operator's leader half in
// process: the reconcilers, the orchestrator (trigger engine + dispatcher)
// and the session gateway's HTTP API. No Knative controller runs, so with
// --function-url it plays Knative's part: every Knative Service becomes
// Ready with that URL, where the test serves the workflow's functions.
//
// It prints "READY <kubeconfig>" on stdout once everything serves, and
// stops (tearing the control plane down) when stdin closes or on SIGTERM.
//
//	go run ./sdk/python/tests/testenv --dir /tmp/x [--gateway 127.0.0.1:8088 --function-url http://127.0.0.1:9000/]
//
// With --control it runs only the operator's control server with its
// messaging directory, authenticating sidecars with TokenReview on the API
// server (internal/tools/servers.StartOperator), and prints "CONTROL <addr>"
// once it serves. It then answers lines on stdin, one at a time:
//
//	pod <namespace> <name>   ->  TOKEN <path>   (creates the pod and writes its
//	                              pod-bound token for ZIPTRAIL_TOKEN_FILE)
//	                         or  ERR <message>
//
//	go run ./sdk/python/tests/testenv --dir /tmp/x --control
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"knative.dev/pkg/apis"
	duckv1 "knative.dev/pkg/apis/duck/v1"
	servingv1 "knative.dev/serving/pkg/apis/serving/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/ziptrail/ziptrail/internal/localcluster"
	"github.com/ziptrail/ziptrail/internal/operator/app"
	"github.com/ziptrail/ziptrail/internal/operator/gateway"
	"github.com/ziptrail/ziptrail/internal/tools/envtest"
	"github.com/ziptrail/ziptrail/internal/tools/servers"
)

func main() {
	dir := flag.String("dir", "", "directory for the kubeconfig (required)")
	gatewayAddr := flag.String("gateway", "", "run the operator with its session gateway on this address")
	functionURL := flag.String("function-url", "", "mark every Knative Service Ready with this URL")
	controlOnly := flag.Bool("control", false, "run only the operator's control server (messaging directory, TokenReview); answer `pod <ns> <name>` lines on stdin")
	flag.Parse()
	if *dir == "" {
		fmt.Fprintln(os.Stderr, "testenv: --dir is required")
		os.Exit(2)
	}
	if *controlOnly {
		if err := runControl(*dir, os.Stdin, os.Stdout); err != nil {
			fmt.Fprintf(os.Stderr, "testenv: %v\n", err)
			os.Exit(1)
		}
		return
	}
	if err := run(*dir, *gatewayAddr, *functionURL); err != nil {
		fmt.Fprintf(os.Stderr, "testenv: %v\n", err)
		os.Exit(1)
	}
}

func run(dir, gatewayAddr, functionURL string) error {
	ctrl.SetLogger(logr.Discard())
	env, err := envtest.Start()
	if err != nil {
		return err
	}
	defer func() { _ = env.Stop() }()
	kubeconfig, err := env.Kubeconfig(dir)
	if err != nil {
		return err
	}
	k8s, err := client.New(env.Config, client.Options{Scheme: envtest.Scheme()})
	if err != nil {
		return err
	}
	// The gateway checks bearer tokens: the kubeconfig's user gets an
	// admin ServiceAccount's token next to its client certificate.
	if _, err := localcluster.GatewayCredentials(context.Background(), k8s, env.Config, kubeconfig); err != nil {
		return err
	}
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer cancel()
	go func() { // the test closes stdin (or dies): stop
		_, _ = io.Copy(io.Discard, os.Stdin)
		cancel()
	}()

	errc := make(chan error, 3)
	if gatewayAddr != "" {
		if err := startOperator(ctx, env, gatewayAddr, errc); err != nil {
			return err
		}
	}
	if functionURL != "" {
		u, err := apis.ParseURL(functionURL)
		if err != nil {
			return fmt.Errorf("--function-url: %w", err)
		}
		go playKnative(ctx, k8s, u)
	}
	fmt.Printf("READY %s\n", kubeconfig)
	select {
	case <-ctx.Done():
		return nil
	case err := <-errc:
		return err
	}
}

// OperatorNamespace is where the tests' operator reads its shuffle
// calibration ConfigMap.
const OperatorNamespace = "ziptrail-system"

// startOperator runs the operator as cmd/operator does
// (internal/operator/app), on the leader, minus the control stream and the
// input store (functions here report outputs in their responses and get
// their inputs inline), with the session gateway on addr.
func startOperator(ctx context.Context, env *envtest.Env, addr string, errc chan<- error) error {
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{Scheme: envtest.Scheme(), Metrics: metricsserver.Options{BindAddress: "0"}})
	if err != nil {
		return err
	}
	cfg := app.DefaultConfig()
	cfg.RedisAddr, cfg.S3Endpoint = "", "" // no tiers here, whatever the environment says
	cfg.Direct = false                     // the functions' URLs, as the Services say
	// Its logs go to ctrl.Log, which run discards.
	op, err := app.New(mgr, env.Config, cfg, app.Options{InlineInputs: true,
		// The shuffle planner's calibration, as cmd/operator reads it, in
		// the namespace the tests play the operator's (re-read each time).
		Calibration: &gateway.ConfigMapCalibration{Reader: mgr.GetAPIReader(), Namespace: OperatorNamespace, TTL: time.Nanosecond}})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	hs := &http.Server{Handler: op.Gateway, ReadHeaderTimeout: 10 * time.Second, ConnContext: op.Gateway.ConnContext}
	go func() { errc <- mgr.Start(ctx) }()
	go func() {
		if err := hs.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			errc <- err
		}
	}()
	go func() {
		<-ctx.Done()
		_ = hs.Close()
	}()
	return nil
}

// playKnative marks every Knative Service Ready at url, as Knative would
// once its revision serves.
func playKnative(ctx context.Context, k8s client.Client, url *apis.URL) {
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		var list servingv1.ServiceList
		if err := k8s.List(ctx, &list); err != nil {
			continue
		}
		for i := range list.Items {
			svc := &list.Items[i]
			if svc.Status.ObservedGeneration == svc.Generation && svc.Status.URL != nil {
				continue
			}
			svc.Status.ObservedGeneration = svc.Generation
			svc.Status.Conditions = duckv1.Conditions{{Type: apis.ConditionReady, Status: corev1.ConditionTrue}}
			svc.Status.URL = url
			svc.Status.Address = &duckv1.Addressable{URL: url}
			_ = k8s.Status().Update(ctx, svc)
		}
	}
}

// runControl serves the operator's control server until stdin closes (or
// SIGTERM), creating pods and their tokens on request.
func runControl(dir string, in io.Reader, out io.Writer) error {
	ctrl.SetLogger(logr.Discard())
	h := &servers.ProcessTB{Dir: dir}
	defer h.Close()
	var op *servers.Operator
	if err := h.Do(func() { op = servers.StartOperator(h) }); err != nil {
		return err
	}
	fmt.Fprintf(out, "CONTROL %s\n", op.Addr)
	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(in)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM, os.Interrupt)
	for {
		select {
		case <-term:
			return nil
		case line, ok := <-lines:
			if !ok {
				return nil
			}
			fmt.Fprintln(out, command(h, op, line))
		}
	}
}

// command answers one request line: "pod <namespace> <name>" makes the
// pod and its token file.
func command(h *servers.ProcessTB, op *servers.Operator, line string) string {
	f := strings.Fields(line)
	if len(f) != 3 || f[0] != "pod" {
		return fmt.Sprintf("ERR unknown command %q (want: pod <namespace> <name>)", line)
	}
	var path string
	if err := h.Do(func() { path = op.PodToken(h, f[1], f[2]) }); err != nil {
		return "ERR " + strings.ReplaceAll(err.Error(), "\n", " ")
	}
	return "TOKEN " + path
}
