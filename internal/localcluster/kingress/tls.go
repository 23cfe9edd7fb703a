package kingress

import (
	"crypto/tls"
	"fmt"
	"sync"
	"sync/atomic"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	corelisters "k8s.io/client-go/listers/core/v1"
)

// certStore serves the certificates of the Ingresses' spec.tls entries to
// the HTTPS listener by SNI, read from their Secrets (kubernetes.io/tls
// keys tls.crt and tls.key) and parsed once per Secret version.
type certStore struct {
	secrets corelisters.SecretLister
	// hosts maps a host to the Secret holding its certificate; replaced
	// whole on every publish.
	hosts atomic.Pointer[map[string]types.NamespacedName]

	mu     sync.Mutex
	parsed map[types.NamespacedName]parsedCert
}

type parsedCert struct {
	resourceVersion string
	cert            *tls.Certificate
	err             error
}

func newCertStore(secrets corelisters.SecretLister) *certStore {
	cs := &certStore{secrets: secrets, parsed: map[types.NamespacedName]parsedCert{}}
	cs.hosts.Store(&map[string]types.NamespacedName{})
	return cs
}

// set publishes the host → Secret map.
func (cs *certStore) set(hosts map[string]types.NamespacedName) { cs.hosts.Store(&hosts) }

// GetCertificate is tls.Config.GetCertificate.
func (cs *certStore) GetCertificate(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
	host := normalizeHost(hello.ServerName)
	key, ok := (*cs.hosts.Load())[host]
	if !ok {
		return nil, fmt.Errorf("no ingress has a TLS certificate for %q", host)
	}
	secret, err := cs.secrets.Secrets(key.Namespace).Get(key.Name)
	if err != nil {
		return nil, fmt.Errorf("TLS secret %s of host %q: %w", key, host, err)
	}
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if p, ok := cs.parsed[key]; ok && p.resourceVersion == secret.ResourceVersion {
		return p.cert, p.err
	}
	p := parsedCert{resourceVersion: secret.ResourceVersion}
	c, err := tls.X509KeyPair(secret.Data[corev1.TLSCertKey], secret.Data[corev1.TLSPrivateKeyKey])
	if err != nil {
		p.err = fmt.Errorf("TLS secret %s of host %q: %w", key, host, err)
	} else {
		p.cert = &c
	}
	cs.parsed[key] = p
	return p.cert, p.err
}
