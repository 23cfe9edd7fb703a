// Package invocation is the wire format of a ziptrail invocation: the HTTP
// request the operator's dispatcher sends to a function's Knative URL, which
// the function pod's queue-proxy-zl resolves (pulling referenced objects
// from their producers) before handing it to the function.
package invocation

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
)

// ContentType marks a request body as an Envelope.
const ContentType = "application/vnd.ziptrail.invocation+json"

// Headers carried by every invocation, so that proxies and logs can see
// which session a request belongs to without reading the body.
const (
	HeaderSession    = "Ziptrail-Session"
	HeaderInvocation = "Ziptrail-Invocation"
	HeaderFunction   = "Ziptrail-Function"
	HeaderAttempt    = "Ziptrail-Attempt"
	// HeaderRefs lists the envelope's references (comma-separated), for the
	// activator extension that keeps them alive during a cold start.
	HeaderRefs = "Ziptrail-Refs"
	// HeaderProducerNode names the node of the pod that produced the
	// envelope's largest referenced object whose producer the operator
	// knows (from that pod's control stream), for the activator
	// extension's locality preference. Absent when no producer is known.
	HeaderProducerNode = "Ziptrail-Producer-Node"
	// HeaderErrorReason names the error class (a local API reason such as
	// PRODUCER_GONE) on a sidecar's 424 answer to an invocation whose
	// inputs it could not resolve, so the caller's SDK can type the error.
	HeaderErrorReason = "Ziptrail-Error-Reason"
)

// MaxEnvelopeBytes bounds a request body: large objects travel by
// reference, only small ones inline.
const MaxEnvelopeBytes = 64 << 20

// Object is one input object: by reference, or inline when small.
type Object struct {
	Bucket string `json:"bucket"`
	Key    string `json:"key"`
	Size   int64  `json:"size"`
	Ref    string `json:"ref,omitempty"`
	// Inline is omitted when nil only (omitzero): an empty object is
	// sent as "inline": "", so the receiver does not mistake it for an
	// object without contents, or for a reference to resolve (inline
	// bytes come first).
	Inline   []byte            `json:"inline,omitzero"`
	Metadata map[string]string `json:"metadata,omitempty"`
	// Path is set only by the receiving sidecar, for an object it pulled:
	// the bare name (see NewInputName) of the file it placed in the pod's
	// object directory, for the SDK to map. The sidecar refuses envelopes
	// that arrive with a path, and SDKs open nothing but such names inside
	// their own object directory (OpenInDir).
	Path string `json:"path,omitempty"`
	// FiredLocally, on an output in a response, are the invocations the
	// producer's sidecar made itself for this object (delegated firing,
	// docs/control-stream.md); set by that sidecar only (it clears what
	// the function wrote there).
	FiredLocally []string `json:"firedLocally,omitempty"`
}

// Len is the object's size in bytes: Size when the object has one (a
// reference's), else its inline bytes.
func (o Object) Len() int64 {
	if o.Size > 0 {
		return o.Size
	}
	return int64(len(o.Inline))
}

// Envelope is the body of an invocation.
type Envelope struct {
	Namespace  string   `json:"namespace"`
	Workflow   string   `json:"workflow,omitempty"`
	Function   string   `json:"function"`
	Session    string   `json:"session"`
	Invocation string   `json:"invocation"`
	Attempt    int      `json:"attempt"`
	Trigger    string   `json:"trigger,omitempty"`
	Group      string   `json:"group,omitempty"` // DynamicGroup's group name
	Args       []byte   `json:"args,omitempty"`
	Objects    []Object `json:"objects,omitempty"`
	// Delegated says a producer's sidecar sent this invocation itself
	// (delegated firing): the receiving sidecar reports its outcome to the
	// operator over its control stream, since the operator does not read
	// the response.
	Delegated bool `json:"delegated,omitempty"`
	// IdempotencyKey is the invocation's key (Key: session, invocation
	// id, attempt), for side effects the function makes outside ziptrail;
	// the receiving sidecar sets it from the other fields before the
	// function sees the envelope, whatever the sender wrote.
	IdempotencyKey string `json:"idempotencyKey,omitempty"`
}

// Refs lists the references among the objects.
func (e *Envelope) Refs() []string {
	var refs []string
	for _, o := range e.Objects {
		if o.Ref != "" {
			refs = append(refs, o.Ref)
		}
	}
	return refs
}

// Validate checks what a receiver relies on.
func (e *Envelope) Validate() error {
	if e.Session == "" || e.Function == "" || e.Invocation == "" {
		return errors.New("invocation: session, function and invocation id are required")
	}
	for i, o := range e.Objects {
		if o.Bucket == "" || o.Key == "" {
			return fmt.Errorf("invocation: object %d: bucket and key are required", i)
		}
		if o.Ref == "" && o.Inline == nil && o.Path == "" {
			return fmt.Errorf("invocation: object %s/%s has neither a reference nor inline bytes", o.Bucket, o.Key)
		}
		if o.Path == "" {
			continue
		}
		if o.Inline != nil {
			return fmt.Errorf("invocation: object %s/%s has both inline bytes and a path", o.Bucket, o.Key)
		}
		if !IsInputName(o.Path) {
			return fmt.Errorf("invocation: object %s/%s: %w: path %q is not a name the pod's sidecar gives its inputs", o.Bucket, o.Key, ErrBadPath, o.Path)
		}
	}
	return nil
}

// RefusePaths fails for an envelope with a path in it. A sidecar receives
// envelopes from outside the pod, which never name files: only the
// sidecar itself places inputs in the object directory.
func (e *Envelope) RefusePaths() error {
	for _, o := range e.Objects {
		if o.Path != "" {
			return fmt.Errorf("invocation: object %s/%s names a file path (%q): %w; send a reference or inline bytes, "+
				"only the pod's own sidecar hands files to the function", o.Bucket, o.Key, o.Path, ErrPathFromOutside)
		}
	}
	return nil
}

// ErrPathFromOutside: an envelope that reached a sidecar named a file.
var ErrPathFromOutside = errors.New("paths are not accepted from outside the pod")

// IsEnvelope reports whether a request's Content-Type marks an Envelope
// (media types compare case-insensitively; parameters may follow).
func IsEnvelope(contentType string) bool { return hasMediaType(contentType, ContentType) }

// IsOutputs reports whether a response's Content-Type marks Outputs.
func IsOutputs(contentType string) bool { return hasMediaType(contentType, OutputsContentType) }

func hasMediaType(header, mt string) bool {
	header = strings.TrimLeft(header, " \t")
	if len(header) < len(mt) || !strings.EqualFold(header[:len(mt)], mt) {
		return false
	}
	rest := strings.TrimLeft(header[len(mt):], " \t")
	return rest == "" || rest[0] == ';'
}

// Decode reads and validates an envelope, refusing bodies over the limit.
func Decode(r io.Reader) (*Envelope, error) {
	data, err := io.ReadAll(io.LimitReader(r, MaxEnvelopeBytes+1))
	if err != nil {
		return nil, fmt.Errorf("invocation: read body: %w", err)
	}
	if len(data) > MaxEnvelopeBytes {
		return nil, fmt.Errorf("invocation: body exceeds %d bytes; send large objects by reference", MaxEnvelopeBytes)
	}
	e := &Envelope{}
	if err := json.Unmarshal(data, e); err != nil {
		return nil, fmt.Errorf("invocation: malformed envelope: %w", err)
	}
	return e, e.Validate()
}

// OutputsContentType marks a function response that carries objects: the
// SDK's send_object collects small objects (inline) and references to large
// ones (put into the sidecar) and returns them with the response.
const OutputsContentType = "application/vnd.ziptrail.outputs+json"

// Outputs is the body of a function response of OutputsContentType.
type Outputs struct {
	// Objects sent to buckets during the invocation.
	Objects []Object `json:"objects,omitempty"`
	// Return is the handler's return value; it goes to the function's
	// dependency buckets (function-oriented workflows), keyed by its name.
	Return []byte `json:"return,omitempty"`
}

// DecodeOutputs parses and validates a function's outputs.
func DecodeOutputs(data []byte) (*Outputs, error) {
	o := &Outputs{}
	if err := json.Unmarshal(data, o); err != nil {
		return nil, fmt.Errorf("invocation: malformed outputs: %w", err)
	}
	for i, obj := range o.Objects {
		if obj.Bucket == "" || obj.Key == "" {
			return nil, fmt.Errorf("invocation: output %d: bucket and key are required", i)
		}
		if obj.Ref == "" && obj.Inline == nil {
			obj.Inline = []byte{} // an empty object is a valid (e.g. marker) object
			o.Objects[i] = obj
		}
	}
	return o, nil
}
