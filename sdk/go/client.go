package ziptrail

import (
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"

	"github.com/ziptrail/ziptrail/internal/dataplane/localapi"
)

// Config locates the pod's sidecar.
type Config struct {
	// Socket is the sidecar's local API socket (ZIPTRAIL_SOCKET; default
	// sidecar.sock next to ShmDir, where queue-proxy-zl listens by default).
	Socket string
	// ShmDir is the shared-memory directory (an emptyDir with medium
	// Memory) through which object bytes pass (ZIPTRAIL_SHM_DIR; default
	// /dev/shm/ziptrail/objects).
	ShmDir string
	// InlineThreshold: objects up to this size travel inside the request
	// to the sidecar instead of through a file (ZIPTRAIL_INLINE_THRESHOLD;
	// default 64 KiB).
	InlineThreshold int
	// HTTP posts the invocations of InvokeRef and Broadcast; default
	// http.DefaultClient.
	HTTP *http.Client
}

// defaultShmDir is queue-proxy-zl's default object directory.
const defaultShmDir = "/dev/shm/ziptrail/objects"

// ConfigFromEnv reads the environment queue-proxy-zl and the pod share.
func ConfigFromEnv() Config {
	c := Config{Socket: os.Getenv("ZIPTRAIL_SOCKET"), ShmDir: os.Getenv("ZIPTRAIL_SHM_DIR")}
	if n, err := strconv.Atoi(os.Getenv("ZIPTRAIL_INLINE_THRESHOLD")); err == nil {
		c.InlineThreshold = n
	}
	return c
}

// Client talks to the pod's queue-proxy-zl sidecar: the Zipline calls and
// the local-API half of the Pheromone library. It is safe for concurrent
// use; one per process is enough (see Default).
type Client struct {
	api    *localapi.Client
	http   *http.Client
	socket string // the local API's socket (the messaging socket is next to it)
	// msg sends and receives group messages on the sidecar's messaging
	// socket (made on first use, see messages).
	msgOnce sync.Once
	msg     *localapi.MessageClient
}

// Connect returns a client configured from the environment.
func Connect() (*Client, error) { return NewClient(ConfigFromEnv()) }

// NewClient returns a client for cfg. Connecting is lazy: an unreachable
// sidecar shows as ErrUnavailable on the first call.
func NewClient(cfg Config) (*Client, error) {
	if cfg.ShmDir == "" {
		cfg.ShmDir = defaultShmDir
	}
	if cfg.Socket == "" {
		cfg.Socket = filepath.Join(filepath.Dir(cfg.ShmDir), "sidecar.sock")
	}
	// gRPC's unix:// target needs an absolute path.
	socket, err := filepath.Abs(cfg.Socket)
	if err != nil {
		return nil, err
	}
	dir, err := filepath.Abs(cfg.ShmDir)
	if err != nil {
		return nil, err
	}
	api, err := localapi.Dial(socket, dir)
	if err != nil {
		return nil, &Error{Kind: KindUnavailable, Op: "connect", Err: err}
	}
	if cfg.InlineThreshold > 0 {
		api.InlineThreshold = cfg.InlineThreshold
	}
	hc := cfg.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	return &Client{api: api, http: hc, socket: socket}, nil
}

// Close closes the connections to the sidecar.
func (c *Client) Close() error {
	err := c.api.Close()
	_ = c.messages().Close()
	return err
}

// messages is the client of the sidecar's messaging socket (Group.Send and
// Recv), made on first use; it connects as needed.
func (c *Client) messages() *localapi.MessageClient {
	c.msgOnce.Do(func() {
		c.msg = localapi.NewMessageClient(localapi.MessageSocket(c.socket))
		c.msg.LendFiles = true   // large messages' files go back to the sidecar at Close
		c.msg.TCPChannels = true // direct channels across nodes (directmsg.NewConn reads them)
	})
	return c.msg
}

var defaultClient struct {
	mu sync.Mutex
	c  *Client
}

// Default returns the process-wide client the package-level functions use,
// connecting from the environment on first use.
func Default() (*Client, error) {
	defaultClient.mu.Lock()
	defer defaultClient.mu.Unlock()
	if defaultClient.c == nil {
		c, err := Connect()
		if err != nil {
			return nil, err
		}
		defaultClient.c = c
	}
	return defaultClient.c, nil
}

// SetDefault replaces the process-wide client (nil: connect from the
// environment again on next use) and returns the previous one, which the
// caller may close.
func SetDefault(c *Client) *Client {
	defaultClient.mu.Lock()
	defer defaultClient.mu.Unlock()
	old := defaultClient.c
	defaultClient.c = c
	return old
}

func must(op string) (*Client, error) {
	c, err := Default()
	if err != nil {
		var e *Error
		if !errors.As(err, &e) {
			err = &Error{Kind: KindUnavailable, Op: op, Err: err}
		}
		return nil, err
	}
	return c, nil
}
