package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/ziptrail/ziptrail/internal/localcluster"
	"github.com/ziptrail/ziptrail/internal/retry"
	"github.com/ziptrail/ziptrail/sdk/go/admin"
)

// gatewayFlags are the flags of the commands that talk to a session gateway.
type gatewayFlags struct {
	gateway, namespace, stateDir string
	kubeconfig, token            string
	retryFor                     time.Duration
}

func (g *gatewayFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&g.gateway, "gateway", os.Getenv("ZIPTRAIL_GATEWAY"), "session gateway URL (default: the running `ziptrail local up`'s, from its state dir)")
	fs.StringVar(&g.namespace, "n", "default", "namespace of the workflow")
	fs.StringVar(&g.stateDir, "state-dir", defaultStateDir(), "state dir of `ziptrail local up`")
	fs.StringVar(&g.kubeconfig, "kubeconfig", "", "kubeconfig whose credentials the gateway checks (default: $KUBECONFIG, the running `ziptrail local up`'s, ~/.kube/config, in-cluster)")
	fs.StringVar(&g.token, "token", os.Getenv("ZIPTRAIL_TOKEN"), "bearer token to send instead of the kubeconfig's credentials ($ZIPTRAIL_TOKEN)")
	fs.DurationVar(&g.retryFor, "retry-for", retry.DefaultFor, "keep retrying a gateway that cannot be reached or answers 503 (an operator rollout) for this long, with back-off (0: no retries)")
}

// url finds the gateway: the flag, $ZIPTRAIL_GATEWAY, the state file a
// running `ziptrail local up` wrote, else a Helm-installed ziptrail's
// gateway Service on the cluster of the kubeconfig (that of the running
// `local up --no-operator` first): on that local cluster, used when this
// machine reaches its cluster IP (kube-proxy on its host); else named,
// with its address or how to reach it, for the user to pass (on a shared
// cluster a tenant could make a look-alike Service: credentials go only
// where the user says).
func (g *gatewayFlags) url() (string, error) {
	if g.gateway != "" {
		if !strings.Contains(g.gateway, "://") {
			return "http://" + g.gateway, nil
		}
		return strings.TrimSuffix(g.gateway, "/"), nil
	}
	st, err := localcluster.ReadState(g.stateDir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return "", err
	}
	if err == nil && st.GatewayURL != "" {
		return st.GatewayURL, nil
	}
	kubeconfig, ownCluster := g.kubeconfig, false
	if kubeconfig == "" && err == nil && os.Getenv(clientcmd.RecommendedConfigPathEnvVar) == "" {
		kubeconfig, ownCluster = st.Kubeconfig, true // local up --no-operator, then helm install
	}
	switch svc, url := installedGateway(kubeconfig); {
	case url != "" && ownCluster:
		return url, nil
	case url != "":
		// On a shared cluster anyone may create a Service that looks like
		// the chart's: the user's credentials go only where the user says.
		return "", fmt.Errorf("no --gateway given; the cluster of your kubeconfig has a session gateway, Service %s/%s, at %s: if it is your ziptrail's, pass --gateway %s (or set ZIPTRAIL_GATEWAY)",
			svc.Namespace, svc.Name, url, url)
	case svc != nil:
		return "", fmt.Errorf("no --gateway given; the cluster of your kubeconfig has the session gateway %s/%s, whose cluster IP this machine does not reach: e.g. `kubectl -n %s port-forward service/%s %d:%d`, then pass --gateway http://127.0.0.1:%d (or set ZIPTRAIL_GATEWAY)",
			svc.Namespace, svc.Name, svc.Namespace, svc.Name, gatewayPort(svc), gatewayPort(svc), gatewayPort(svc))
	case err == nil:
		return "", fmt.Errorf("the local cluster runs without the operator (local up --no-operator) and no Helm-installed ziptrail gateway was found on it: install the chart (`helm install ...` as local up printed it), or pass --gateway")
	}
	return "", fmt.Errorf("no local cluster is running (no %s): start one with `ziptrail local up`, or pass --gateway (the URL of a Helm-installed ziptrail's Service <release>-gateway, port 8088)", localcluster.StateFile(g.stateDir))
}

// installedGateway looks, with the kubeconfig's credentials (kubeconfig,
// else the default rules), for a Helm-installed ziptrail's gateway Service
// (the chart labels it app.kubernetes.io/name=ziptrail and names it
// <release>-gateway). url is its address when the gateway answers on its
// cluster IP within 2 s; svc is nil when there is none to be
// found (no kubeconfig, no such Service, not allowed to list Services, no
// answer within 5 s).
func installedGateway(kubeconfig string) (svc *corev1.Service, url string) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = kubeconfig
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return nil, ""
	}
	cfg.Timeout = 5 * time.Second
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, ""
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	list, err := cs.CoreV1().Services("").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=ziptrail"})
	if err != nil {
		return nil, ""
	}
	for i := range list.Items {
		if s := &list.Items[i]; strings.HasSuffix(s.Name, "-gateway") {
			svc = s
			break
		}
	}
	if svc == nil || svc.Spec.ClusterIP == "" || svc.Spec.ClusterIP == corev1.ClusterIPNone {
		return svc, ""
	}
	// A connection that opens proves nothing (a sandbox's network may
	// accept any): the answer must be the gateway's (unauthenticated, a
	// 401 that names it).
	url = clusterURL(svc)
	probe := &http.Client{Timeout: 2 * time.Second}
	resp, err := probe.Get(url + "/v1/namespaces/default/sessions")
	if err != nil {
		return svc, ""
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusUnauthorized || !strings.Contains(string(body), "session gateway") {
		return svc, ""
	}
	return svc, url
}

// clusterURL is the gateway Service's address on its cluster IP (a
// variable: tests point it at a gateway they run).
var clusterURL = func(svc *corev1.Service) string {
	return "http://" + net.JoinHostPort(svc.Spec.ClusterIP, strconv.Itoa(gatewayPort(svc)))
}

// gatewayPort is the gateway Service's HTTP port (the chart names it
// http-gateway; 8088 by default).
func gatewayPort(svc *corev1.Service) int {
	for _, p := range svc.Spec.Ports {
		if p.Name == "http-gateway" {
			return int(p.Port)
		}
	}
	return 8088
}

// client is an HTTP client sending the user's Kubernetes credentials, which
// the gateway authenticates (TokenReview) and authorizes
// (SubjectAccessReview): --token, else the kubeconfig of --kubeconfig,
// $KUBECONFIG, the running local cluster (unless --gateway names another),
// then ~/.kube/config or in-cluster.
func (g *gatewayFlags) client(notices io.Writer) (*gwClient, error) {
	hc, err := g.httpClient()
	if err != nil {
		return nil, err
	}
	return &gwClient{hc: hc, retryFor: g.retryFor, notices: notices}, nil
}

func (g *gatewayFlags) httpClient() (*http.Client, error) {
	if g.token != "" {
		return &http.Client{Transport: admin.TokenCredentials(g.token).Transport(nil)}, nil
	}
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	switch {
	case g.kubeconfig != "":
		rules.ExplicitPath = g.kubeconfig
	case os.Getenv(clientcmd.RecommendedConfigPathEnvVar) != "":
	default:
		if st, err := localcluster.ReadState(g.stateDir); err == nil && st.Kubeconfig != "" && (g.gateway == "" || strings.TrimSuffix(g.gateway, "/") == st.GatewayURL) {
			rules.ExplicitPath = st.Kubeconfig
		}
	}
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("Kubernetes credentials for the session gateway (pass --kubeconfig or --token): %w", err)
	}
	creds, err := admin.NewCredentials(cfg)
	if err != nil {
		return nil, err
	}
	return &http.Client{Transport: creds.Transport(nil)}, nil
}
