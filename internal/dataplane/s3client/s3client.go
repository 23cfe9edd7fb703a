// Package s3client is the sidecar's S3 client: PUT, GET and DELETE of one
// object in a path-style bucket, signed with AWS Signature Version 4, on
// net/http. It is what the slow tier needs and nothing more, because every
// pod runs a sidecar: a general S3 SDK (minio-go) cost ~2.2 MiB of
// resident memory per pod (its init compiles regular expressions, it links
// compression and XML code; docs/benchmarks.md, "Sidecar memory").
//
// Requests sign their headers but not their payload (x-amz-content-sha256:
// UNSIGNED-PAYLOAD, which S3 and S3-compatible servers accept): the sidecar
// does not hash every object it backs up; use TLS (Config.Secure) where the
// path to the store is not trusted.
package s3client

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// ErrNotFound: the bucket holds no object under the key.
var ErrNotFound = errors.New("no such key")

// DefaultRegion signs requests when Config.Region is empty (MinIO's and
// S3's default).
const DefaultRegion = "us-east-1"

// MaxObject is the largest object Get accepts (S3's limit for one PUT):
// a store announcing more is refused before anything is allocated.
const MaxObject = 5 << 30

// Config names the store and its credentials.
type Config struct {
	Endpoint             string // host:port
	AccessKey, SecretKey string
	Secure               bool   // https
	Region               string // default DefaultRegion
}

// Client talks to one S3-compatible endpoint. Safe for concurrent use.
type Client struct {
	cfg  Config
	base string
	http *http.Client
	now  func() time.Time
}

// New checks the configuration and returns a client; it does not connect.
func New(cfg Config) (*Client, error) {
	if cfg.Endpoint == "" || strings.ContainsAny(cfg.Endpoint, "/?#@ ") {
		return nil, fmt.Errorf("S3 endpoint %q: want host:port", cfg.Endpoint)
	}
	if cfg.AccessKey == "" || cfg.SecretKey == "" {
		return nil, errors.New("S3 credentials: access key and secret key are required")
	}
	if cfg.Region == "" {
		cfg.Region = DefaultRegion
	}
	scheme := "http"
	if cfg.Secure {
		scheme = "https"
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 32
	return &Client{cfg: cfg, base: scheme + "://" + cfg.Endpoint, http: &http.Client{Transport: tr}, now: time.Now}, nil
}

// Put stores data under bucket/key (one request; S3 takes up to 5 GiB so).
func (c *Client) Put(ctx context.Context, bucket, key string, data []byte) error {
	resp, err := c.do(ctx, http.MethodPut, bucket, key, data)
	if err != nil {
		return err
	}
	defer drain(resp)
	if resp.StatusCode != http.StatusOK {
		return c.failure("put", bucket, key, resp)
	}
	return nil
}

// Get returns the object under bucket/key; ErrNotFound when there is none.
func (c *Client) Get(ctx context.Context, bucket, key string) ([]byte, error) {
	resp, err := c.do(ctx, http.MethodGet, bucket, key, nil)
	if err != nil {
		return nil, err
	}
	defer drain(resp)
	if resp.StatusCode != http.StatusOK {
		return nil, c.failure("get", bucket, key, resp)
	}
	if resp.ContentLength > MaxObject {
		return nil, fmt.Errorf("s3 get %s/%s: the store announces %d bytes, more than an object can be (%d)", bucket, key, resp.ContentLength, int64(MaxObject))
	}
	if resp.ContentLength > 0 {
		b := make([]byte, resp.ContentLength)
		if _, err := io.ReadFull(resp.Body, b); err != nil {
			return nil, fmt.Errorf("s3 get %s/%s: %w", bucket, key, err)
		}
		return b, nil
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, MaxObject+1))
	if err != nil {
		return nil, fmt.Errorf("s3 get %s/%s: %w", bucket, key, err)
	}
	if len(b) > MaxObject {
		return nil, fmt.Errorf("s3 get %s/%s: the store sent more than an object can be (%d bytes)", bucket, key, int64(MaxObject))
	}
	return b, nil
}

// Delete removes bucket/key; a key that is not there is no error (S3's
// own semantics).
func (c *Client) Delete(ctx context.Context, bucket, key string) error {
	resp, err := c.do(ctx, http.MethodDelete, bucket, key, nil)
	if err != nil {
		return err
	}
	defer drain(resp)
	if resp.StatusCode != http.StatusNoContent && resp.StatusCode != http.StatusOK {
		return c.failure("delete", bucket, key, resp)
	}
	return nil
}

func (c *Client) do(ctx context.Context, method, bucket, key string, body []byte) (*http.Response, error) {
	if bucket == "" || key == "" {
		return nil, fmt.Errorf("s3 %s: bucket and key are required (got %q, %q)", strings.ToLower(method), bucket, key)
	}
	path := "/" + escapePath(bucket) + "/" + escapePath(key)
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return nil, fmt.Errorf("s3 %s %s/%s: %w", strings.ToLower(method), bucket, key, err)
	}
	req.URL.RawPath = path // keep our escaping: it is what was signed
	if body != nil {
		req.ContentLength = int64(len(body))
	}
	c.sign(req, path)
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("s3 %s %s/%s: %w", strings.ToLower(method), bucket, key, err)
	}
	return resp, nil
}

// sign adds the Signature Version 4 headers (Authorization, x-amz-date,
// x-amz-content-sha256) for a request without a query string.
func (c *Client) sign(req *http.Request, path string) {
	t := c.now().UTC()
	date, stamp := t.Format("20060102"), t.Format("20060102T150405Z")
	const payload = "UNSIGNED-PAYLOAD"
	req.Header.Set("X-Amz-Date", stamp)
	req.Header.Set("X-Amz-Content-Sha256", payload)
	const signed = "host;x-amz-content-sha256;x-amz-date"
	canonical := strings.Join([]string{req.Method, path, "",
		"host:" + req.URL.Host, "x-amz-content-sha256:" + payload, "x-amz-date:" + stamp, "",
		signed, payload}, "\n")
	scope := date + "/" + c.cfg.Region + "/s3/aws4_request"
	sum := sha256.Sum256([]byte(canonical))
	toSign := "AWS4-HMAC-SHA256\n" + stamp + "\n" + scope + "\n" + hex.EncodeToString(sum[:])
	key := mac([]byte("AWS4"+c.cfg.SecretKey), date)
	key = mac(key, c.cfg.Region)
	key = mac(key, "s3")
	key = mac(key, "aws4_request")
	req.Header.Set("Authorization", "AWS4-HMAC-SHA256 Credential="+c.cfg.AccessKey+"/"+scope+
		", SignedHeaders="+signed+", Signature="+hex.EncodeToString(mac(key, toSign)))
}

func mac(key []byte, s string) []byte {
	h := hmac.New(sha256.New, key)
	h.Write([]byte(s))
	return h.Sum(nil)
}

// escapePath encodes a key as SigV4's canonical URI wants it: every byte
// but the unreserved characters and '/' percent-encoded.
func escapePath(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		ch := s[i]
		if 'A' <= ch && ch <= 'Z' || 'a' <= ch && ch <= 'z' || '0' <= ch && ch <= '9' || strings.IndexByte("-_.~/", ch) >= 0 {
			b.WriteByte(ch)
		} else {
			fmt.Fprintf(&b, "%%%02X", ch)
		}
	}
	return b.String()
}

// Error is a request the store answered with an error.
type Error struct {
	Op, Bucket, Key string
	Status          int
	Code, Message   string // S3's error code (NoSuchKey, AccessDenied, …) and text
}

func (e *Error) Error() string {
	msg := e.Code
	if e.Message != "" {
		msg += ": " + e.Message
	}
	if msg == "" {
		msg = http.StatusText(e.Status)
	}
	return fmt.Sprintf("s3 %s %s/%s: %d %s", e.Op, e.Bucket, e.Key, e.Status, msg)
}

// Is makes errors.Is(err, ErrNotFound) true for a missing key: only the
// store's own NoSuchKey — a bare 404 (a proxy, a wrong endpoint) is not
// proof that no backup exists.
func (e *Error) Is(target error) bool {
	return target == ErrNotFound && e.Code == "NoSuchKey"
}

func (c *Client) failure(op, bucket, key string, resp *http.Response) error {
	e := &Error{Op: op, Bucket: bucket, Key: key, Status: resp.StatusCode}
	// An error document is small (a larger body is not one) and flat:
	// its Code and Message elements are read without an XML decoder.
	if data, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10)); err == nil {
		e.Code, e.Message = element(data, "Code"), element(data, "Message")
	}
	if e.Code == "" {
		// HEAD-like answers (and some proxies) carry no document.
		e.Code = resp.Header.Get("X-Minio-Error-Code")
	}
	return e
}

// element is the text of the first <name>…</name> in an error document.
func element(doc []byte, name string) string {
	open, end := []byte("<"+name+">"), []byte("</"+name+">")
	i := bytes.Index(doc, open)
	if i < 0 {
		return ""
	}
	rest := doc[i+len(open):]
	j := bytes.Index(rest, end)
	if j < 0 || j > 1024 {
		return ""
	}
	return strings.TrimSpace(string(rest[:j]))
}

// drain lets the connection be reused.
func drain(resp *http.Response) {
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
}
