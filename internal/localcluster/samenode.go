package localcluster

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/ziptrail/ziptrail/internal/operator/podwebhook"
)

// podWebhookName is the MutatingWebhookConfiguration of the same-node
// data plane on the local cluster (the chart's is <release>-pods).
const podWebhookName = "ziptrail-local-pods"

// startPodWebhook serves ziptrail's pod webhooks (internal/operator/podwebhook: the
// objects volume and the same-node directory) from
// this process, as the chart's operator replicas do in a cluster, and
// registers it with the API server (a host process: it reaches the
// webhook on 127.0.0.1, TLS with a certificate made here). The node
// agent gives each node its own node directory behind the hostPath.
// The configuration is the chart's: revision pods of ziptrail workflows,
// failurePolicy Ignore.
func (c *Cluster) startPodWebhook(ctx context.Context) error {
	certPEM, cert, err := webhookCert()
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle(podwebhook.Path, &admission.Webhook{Handler: &podwebhook.Mutator{}})
	mux.Handle(podwebhook.ObjectsPath, &admission.Webhook{Handler: podwebhook.ObjectsMutator{}})
	c.podWebhook = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second,
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}}
	go func() { _ = c.podWebhook.Serve(tls.NewListener(ln, c.podWebhook.TLSConfig)) }()

	base := "https://" + ln.Addr().String()
	hook := func(name, path string) admissionv1.MutatingWebhook {
		url := base + path
		return podwebhook.Registration(name, admissionv1.WebhookClientConfig{URL: &url, CABundle: certPEM})
	}
	cfg := &admissionv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: podWebhookName},
		Webhooks:   []admissionv1.MutatingWebhook{hook(podwebhook.ObjectsWebhook, podwebhook.ObjectsPath), hook(podwebhook.SameNodeWebhook, podwebhook.Path)},
	}
	api := c.Clientset.AdmissionregistrationV1().MutatingWebhookConfigurations()
	if old, err := api.Get(ctx, podWebhookName, metav1.GetOptions{}); err == nil {
		cfg.ResourceVersion = old.ResourceVersion
		_, err = api.Update(ctx, cfg, metav1.UpdateOptions{})
		return err
	} else if !apierrors.IsNotFound(err) {
		return err
	}
	_, err = api.Create(ctx, cfg, metav1.CreateOptions{})
	return err
}

// stopPodWebhook stops serving it (the registration stays: with
// failurePolicy Ignore, pods then start without the mount).
func (c *Cluster) stopPodWebhook() error {
	if c.podWebhook == nil {
		return nil
	}
	return c.podWebhook.Close()
}

// webhookCert is a self-signed certificate for 127.0.0.1, its own CA.
func webhookCert() ([]byte, tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, tls.Certificate{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: "ziptrail-local-pod-webhook"},
		NotBefore:    time.Now().Add(-time.Hour), NotAfter: time.Now().AddDate(10, 0, 0),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, tls.Certificate{}, fmt.Errorf("pod webhook certificate: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}
