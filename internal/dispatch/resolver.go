package dispatch

import (
	"context"
	"fmt"
	"net/url"

	servingv1 "knative.dev/serving/pkg/apis/serving/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// ServiceResolver reads a Knative Service's URL from its status: the
// cluster-local address when Knative publishes one (the operator runs in the
// cluster), else the public URL.
type ServiceResolver struct {
	Reader client.Reader
}

// URL implements Resolver.
func (r ServiceResolver) URL(ctx context.Context, namespace, service string) (*url.URL, error) {
	svc := &servingv1.Service{}
	if err := r.Reader.Get(ctx, client.ObjectKey{Namespace: namespace, Name: service}, svc); err != nil {
		return nil, err
	}
	if a := svc.Status.Address; a != nil && a.URL != nil {
		return a.URL.URL(), nil
	}
	if svc.Status.URL != nil {
		return svc.Status.URL.URL(), nil
	}
	return nil, fmt.Errorf("knative service %s/%s has no URL yet (not ready)", namespace, service)
}
