package kingress

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"math/big"
	"net"
	"net/http"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"knative.dev/networking/pkg/apis/networking/v1alpha1"
)

// selfSigned returns PEM certificate and key for host, and a pool trusting it.
func selfSigned(t *testing.T, host string) (certPEM, keyPEM []byte, pool *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: host}, DNSNames: []string{host},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kb, _ := x509.MarshalECPrivateKey(key)
	c, _ := x509.ParseCertificate(der)
	pool = x509.NewCertPool()
	pool.AddCert(c)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), pool
}

// TestTLSAndRedirect: spec.tls hosts are served over HTTPS with the
// Secret's certificate (by SNI, HTTP/2 negotiated); httpOption Redirected
// answers plain HTTP on the external listener with 301 to https, and not on
// the cluster-local one; an unknown SNI gets no certificate.
func TestTLSAndRedirect(t *testing.T) {
	ns := namespace(t)
	a := newBackend(t, "a", nil)
	publish(t, ns, "svc-a", true, a.addr)
	const host = "secure.example.com"
	certPEM, keyPEM, pool := selfSigned(t, host)
	if _, err := kube.CoreV1().Secrets(ns).Create(context.Background(), &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "cert"}, Type: corev1.SecretTypeTLS,
		Data: map[string][]byte{corev1.TLSCertKey: certPEM, corev1.TLSPrivateKeyKey: keyPEM},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ing := &v1alpha1.Ingress{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "tls", Annotations: map[string]string{"networking.knative.dev/ingress.class": ClassName}},
		Spec: v1alpha1.IngressSpec{
			HTTPOption: v1alpha1.HTTPOptionRedirected,
			TLS:        []v1alpha1.IngressTLS{{Hosts: []string{host}, SecretName: "cert", SecretNamespace: ns}},
			Rules:      []v1alpha1.IngressRule{rule(v1alpha1.IngressVisibilityExternalIP, []string{host}, path("", splitTo(ns, "svc-a", 100, nil)))},
		},
	}
	if _, err := netcs.NetworkingV1alpha1().Ingresses(ns).Create(context.Background(), ing, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	deleteAtEnd(t, ns, "tls")
	waitReady(t, ns, "tls")

	hc := &http.Client{Transport: &http.Transport{
		TLSClientConfig:   &tls.Config{RootCAs: pool, ServerName: host},
		ForceAttemptHTTP2: true,
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, tlsAddr)
		},
	}}
	resp, err := hc.Get("https://" + host + "/x")
	if err != nil {
		t.Fatalf("HTTPS: %v", err)
	}
	var e echo
	_ = json.NewDecoder(resp.Body).Decode(&e)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || e.Name != "a" || resp.Proto != "HTTP/2.0" {
		t.Errorf("HTTPS: %d %s from %q, want 200 over HTTP/2 from a", resp.StatusCode, resp.Proto, e.Name)
	}

	noFollow := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	req, _ := http.NewRequest(http.MethodGet, "http://"+extAddr+"/x?y=1", nil)
	req.Host = host
	resp, err = noFollow.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMovedPermanently || resp.Header.Get("Location") != "https://"+host+"/x?y=1" {
		t.Errorf("plain HTTP on the external listener: %d Location %q, want 301 to https", resp.StatusCode, resp.Header.Get("Location"))
	}
	if code, e, body := get(t, locAddr, host, "/x", nil); code != http.StatusOK || e.Name != "a" {
		t.Errorf("cluster-local listener: %d %q, want 200 (no redirect inside the cluster)", code, body)
	}

	c, err := tls.Dial("tcp", tlsAddr, &tls.Config{RootCAs: pool, ServerName: "other.example.com"})
	if err == nil {
		c.Close()
		t.Errorf("TLS handshake for an unknown SNI succeeded")
	}
}
