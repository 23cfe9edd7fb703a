package helm

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	authv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ziptrail/ziptrail/internal/operator/control/guard/guardtest"
	"github.com/ziptrail/ziptrail/internal/operator/gateway/gatewayv1"
)

// flood is namespace A's flood, its counts and the answers it did not expect.
type flood struct {
	started, refusedStarts, unauthenticated, closedConns, oversized, forgedAnswered atomic.Int64

	mu       sync.Mutex
	limits   map[string]bool
	codes    map[int]int
	unwanted []string
}

func (f *flood) unexpected(format string, args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.unwanted) < 20 {
		f.unwanted = append(f.unwanted, fmt.Sprintf(format, args...))
	}
}

func (f *flood) errs() []string { f.mu.Lock(); defer f.mu.Unlock(); return slices.Clone(f.unwanted) }

func (f *flood) limitNames() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for n := range f.limits {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

func (f *flood) forgedCodes() map[int]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return maps.Clone(f.codes)
}

var (
	tokenAOnce sync.Once
	tokenA     string
)

// tokenOfA is a token of ServiceAccount noisy-a/flooder, bound to the
// chart's ziptrail-session-runner ClusterRole in namespace A only.
func tokenOfA() string {
	tokenAOnce.Do(func() {
		sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: noisyA, Name: "flooder"}}
		Expect(client.IgnoreAlreadyExists(k8s.Create(ctx, sa))).To(Succeed())
		Expect(client.IgnoreAlreadyExists(k8s.Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: noisyA, Name: "flooder"},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "ziptrail-session-runner"},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: noisyA, Name: "flooder"}}}))).To(Succeed())
		tr := &authv1.TokenRequest{}
		Expect(k8s.SubResource("token").Create(ctx, sa, tr)).To(Succeed())
		tokenA = tr.Status.Token
	})
	return tokenA
}

// sessions starts A's hold sessions as fast as the gateway answers: the
// first reach A's running-sessions limit, the rest are refused (429)
// naming a limit.
func (f *flood) sessions(ctx context.Context) {
	base, token := gatewayURL(), tokenOfA()
	c := &http.Client{Timeout: 30 * time.Second}
	for ctx.Err() == nil {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, fmt.Sprintf("%s/v1/namespaces/%s/workflows/hold/sessions", base, noisyA), strings.NewReader("x"))
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := c.Do(req)
		if err != nil {
			if ctx.Err() == nil {
				f.unexpected("start a session of A: %v", err)
			}
			return
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		switch resp.StatusCode {
		case http.StatusCreated:
			f.started.Add(1)
		case http.StatusTooManyRequests:
			f.refusedStarts.Add(1)
			f.mu.Lock()
			if f.limits == nil {
				f.limits = map[string]bool{}
			}
			for _, n := range []string{"sessionsPerNamespace", "requestsPerSecond", "inputBytesPerNamespace"} {
				if strings.Contains(string(body), n) {
					f.limits[n] = true
				}
			}
			f.mu.Unlock()
			if resp.Header.Get("Retry-After") == "" {
				f.unexpected("a 429 without Retry-After: %s", body)
			}
		default:
			f.unexpected("start a session of A: %d %s", resp.StatusCode, body)
		}
	}
}

// gatewayGRPCAddr is the chart's gRPC session gateway Service, host:port.
func gatewayGRPCAddr() string {
	_, addr, err := rel.Gateway(ctx)
	Expect(err).NotTo(HaveOccurred())
	return addr
}

// gatewayGRPC dials the chart's gRPC session gateway.
func gatewayGRPC() *grpc.ClientConn {
	conn, err := grpc.NewClient(gatewayGRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(128<<20)))
	Expect(err).NotTo(HaveOccurred())
	return conn
}

// The flood's clients send a request message encoded once, again and
// again, without marshalling (or copying) 60 MiB a call in this process,
// which shares the machine's cores with B's sessions (an attacker on
// another machine pays that, not the cluster): guardtest.RawCodec sends
// the bytes as they are.
type encoded = []byte

// startSession sends an encoded StartSessionRequest.
func startSession(ctx context.Context, conn *grpc.ClientConn, req encoded) error {
	return conn.Invoke(ctx, gatewayv1.Gateway_StartSession_FullMethodName, req, &gatewayv1.Session{}, grpc.ForceCodec(guardtest.RawCodec{}))
}

func encode(m proto.Message) encoded {
	b, err := proto.Marshal(m)
	Expect(err).NotTo(HaveOccurred())
	return b
}

// unauthenticatedGRPC sends 60 MiB StartSession bodies with a token that is
// not one, on 4 connections at a time: each must be refused Unauthenticated
// (before the server reads the body).
func (f *flood) unauthenticatedGRPC(ctx context.Context) {
	req := encode(&gatewayv1.StartSessionRequest{Namespace: noisyB, Workflow: "wordcount", Input: make([]byte, 60<<20)})
	var wg sync.WaitGroup
	for c := 0; c < 4; c++ {
		wg.Add(1)
		go func() {
			defer GinkgoRecover()
			defer wg.Done()
			conn := gatewayGRPC()
			defer conn.Close()
			for ctx.Err() == nil {
				cctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer not-a-token"), 30*time.Second)
				err := startSession(cctx, conn, req)
				cancel()
				switch {
				case ctx.Err() != nil:
				case status.Code(err) == codes.Unauthenticated:
					f.unauthenticated.Add(1)
				case status.Code(err) == codes.Unavailable:
					// The gateway closes a connection that authenticated
					// no call within its AuthTimeout (10 s).
					f.closedConns.Add(1)
				default:
					f.unexpected("an unauthenticated 60 MiB StartSession: %v", err)
				}
			}
		}()
	}
	wg.Wait()
}

// oversizedGRPC sends, with A's own token, StartSession bodies over what
// the gateway takes: each must be refused with a message naming the limit.
func (f *flood) oversizedGRPC(ctx context.Context) {
	req := encode(&gatewayv1.StartSessionRequest{Namespace: noisyA, Workflow: "hold", Input: make([]byte, 100<<20)})
	conn := gatewayGRPC()
	defer conn.Close()
	for ctx.Err() == nil {
		cctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+tokenOfA()), 30*time.Second)
		err := startSession(cctx, conn, req)
		cancel()
		switch code := status.Code(err); {
		case ctx.Err() != nil:
		case code == codes.ResourceExhausted || code == codes.InvalidArgument:
			f.oversized.Add(1)
		default:
			f.unexpected("a 100 MiB StartSession of A: %v", err)
		}
	}
}

// forgedRefs sends requests to A's function through the ingress and
// activator-ext with references forged under unknown key ids (the header
// that killed the activator, issue 31 item 1), 25 a second.
func (f *flood) forgedRefs(ctx context.Context) {
	tick := time.NewTicker(40 * time.Millisecond)
	defer tick.Stop()
	c := &http.Client{Timeout: 30 * time.Second}
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, kn.IngressURL, strings.NewReader("{}"))
		req.Host = fmt.Sprintf("via-echo.%s.%s", noisyA, kn.Domain)
		req.Header.Set("Ziptrail-Refs", "zt1.AXg,"+forged())
		resp, err := c.Do(req)
		if err != nil {
			if ctx.Err() == nil && !errors.Is(err, context.Canceled) {
				f.unexpected("a request with forged references through the activator: %v", err)
			}
			continue
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		f.forgedAnswered.Add(1)
		f.mu.Lock()
		if f.codes == nil {
			f.codes = map[int]int{}
		}
		f.codes[resp.StatusCode]++
		f.mu.Unlock()
		if resp.StatusCode == http.StatusBadGateway || resp.StatusCode == http.StatusServiceUnavailable {
			f.unexpected("the activator answered %d to a request with forged references", resp.StatusCode)
		}
	}
}

// forged is a well-formed reference under a random key id.
func forged() string {
	id := make([]byte, 8)
	_, _ = rand.Read(id)
	body := make([]byte, 52)
	_, _ = rand.Read(body)
	return "zt1." + base64.RawURLEncoding.EncodeToString(append(append([]byte{byte(len(id))}, id...), body...))
}

// printPanicsRecovered prints activator-ext's recovered panics (each a
// defect worth reading), from its Prometheus endpoint.
func printPanicsRecovered(pods []corev1.Pod) {
	for _, p := range pods {
		resp, err := http.Get("http://" + p.Status.PodIP + ":9090/metrics")
		if err != nil {
			continue
		}
		data, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		for _, l := range strings.Split(string(data), "\n") {
			if strings.Contains(l, "ziptrail_activator_panics") && !strings.HasPrefix(l, "#") {
				GinkgoWriter.Printf("activator pod %s: %s\n", p.Name, l)
			}
		}
	}
}
