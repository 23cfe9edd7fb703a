package localapi

import (
	"context"
	"errors"
	"fmt"
	"math"

	"github.com/ziptrail/ziptrail/internal/dataplane/localapi/sidecarv1"
	"github.com/ziptrail/ziptrail/internal/dataplane/store"
	"github.com/ziptrail/ziptrail/internal/operator/control/controlv1"
)

// Pheromone's named objects: send_object and get_object.

// nameKey is a named object's key among the objects this pod sent.
func nameKey(session, bucket, key string) string { return session + "\x00" + bucket + "\x00" + key }

// persistID is where a persisted object lives in the slow tier.
func persistID(session, bucket, key string) string {
	if session == "" {
		return "persist/" + bucket + "/" + key
	}
	return "persist/" + bucket + "/" + session + "/" + key
}

// SendObject implements Pheromone's send_object.
func (s *Server) SendObject(ctx context.Context, req *sidecarv1.SendObjectRequest) (*sidecarv1.SendObjectResponse, error) {
	if req.GetBucket() == "" || req.GetKey() == "" {
		return nil, toStatus(fmt.Errorf("%w: send_object needs a bucket and a key", ErrBadPayload))
	}
	if req.GetPersist() && s.Persist == nil {
		return nil, toStatus(fmt.Errorf("%w: persist requested but no S3 tier is configured", ErrBadPayload))
	}
	obj, release, err := s.loadObject(ctx, req.GetObject(), "")
	if err != nil {
		return nil, toStatus(s.putError(store.Meta{Bucket: req.GetBucket(), Key: req.GetKey()}, -1, err))
	}
	defer release()
	data := obj.data
	resp := &sidecarv1.SendObjectResponse{Size: int64(len(data))}
	if req.GetPersist() {
		pdata := data
		if obj.free != nil {
			// The S3 client reads it in user space: a copy that a
			// truncated file cannot turn into a crash.
			if pdata, err = store.Clone(data); err != nil {
				return nil, toStatus(fmt.Errorf("%w: %v", ErrBadPayload, err))
			}
		}
		if err := s.Persist.Put(ctx, persistID(req.GetSession(), req.GetBucket(), req.GetKey()), pdata, 0); err != nil {
			return nil, toStatus(fmt.Errorf("persist %s/%s: %w", req.GetBucket(), req.GetKey(), err))
		}
		resp.Persisted = true
	}
	// Any number of consumers may read a bucket's object: it lives until
	// the session is collected or its TTL passes.
	m := store.Meta{ID: s.newID("obj"), Session: req.GetSession(), Bucket: req.GetBucket(), Key: req.GetKey(),
		Reads: math.MaxUint32, Expires: s.now().Add(s.ttl(0)), Metadata: req.GetMetadata()}
	r, err := s.put(ctx, m, obj)
	if err != nil {
		return nil, toStatus(err)
	}
	s.remember(nameKey(req.GetSession(), req.GetBucket(), req.GetKey()), m.ID)
	ev := &controlv1.ObjectReady{Session: req.GetSession(), Bucket: req.GetBucket(), Key: req.GetKey(), Size: resp.Size,
		Metadata: req.GetMetadata(), ProducerFunction: s.Function, InvocationId: req.GetInvocationId(), Persisted: resp.Persisted}
	if len(data) <= s.InlineThreshold {
		// Small objects travel with the event; an empty one stays one
		// (non-nil, so present on the wire).
		ev.Inline = data
		if ev.Inline == nil {
			ev.Inline = []byte{}
		}
	} else {
		ev.Ref, resp.Ref = r, r
	}
	if s.Reporter != nil {
		if err := s.Reporter.Report(ev); err != nil {
			return nil, toStatus(fmt.Errorf("report object %s/%s to the operator: %w", req.GetBucket(), req.GetKey(), err))
		}
		s.sent.add(req.GetSession(), req.GetInvocationId(), req.GetBucket(), req.GetKey(), s.now(), s.ttl(0))
	}
	return resp, nil
}

// remember indexes an object by name, dropping entries of freed objects
// once the index outgrows the store (amortized, so it stays bounded).
func (s *Server) remember(name, id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.byName == nil {
		s.byName = map[string]string{}
	}
	if old, ok := s.byName[name]; ok && old != id {
		s.Store.Remove(old) // a re-sent key replaces the object
	}
	s.byName[name] = id
	if n := len(s.byName); n > 1024 && n > 2*s.Store.Len() {
		for k, v := range s.byName {
			if _, _, ok := s.Store.Peek(v); !ok {
				delete(s.byName, k)
			}
		}
	}
}

// GetObject implements Pheromone's get_object: an object this pod sent,
// else a persisted one.
func (s *Server) GetObject(ctx context.Context, req *sidecarv1.GetObjectRequest) (*sidecarv1.GetResponse, error) {
	s.files(ctx) // takes back the files the caller released
	name := nameKey(req.GetSession(), req.GetBucket(), req.GetKey())
	s.mu.Lock()
	id, ok := s.byName[name]
	s.mu.Unlock()
	var errs []error
	if ok {
		resp, err := s.readLocal(ctx, id)
		if err == nil {
			return resp, nil
		}
		errs = append(errs, err)
	}
	if s.Persist != nil {
		data, err := s.Persist.Get(ctx, persistID(req.GetSession(), req.GetBucket(), req.GetKey()))
		if err == nil {
			resp, err := s.respond(ctx, data, s.Persist.Name())
			return resp, toStatus(err)
		}
		errs = append(errs, err)
	}
	if len(errs) == 0 {
		errs = append(errs, fmt.Errorf("%s/%s: %w (not sent from this pod, and no persist tier)", req.GetBucket(), req.GetKey(), store.ErrNotFound))
	}
	return nil, toStatus(errors.Join(errs...))
}
