package sidecar

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	"github.com/ziptrail/ziptrail/internal/dataplane/localapi"
	"github.com/ziptrail/ziptrail/internal/dataplane/localapi/sidecarv1"
	"github.com/ziptrail/ziptrail/internal/invocation"
	"github.com/ziptrail/ziptrail/internal/nodedir"
	"github.com/ziptrail/ziptrail/internal/tools/servers"
)

// samenodeGets reads ziptrail_dataplane_samenode_gets_total{result}.
func samenodeGets(t *testing.T, result string) float64 {
	t.Helper()
	return counter(t, "ziptrail_dataplane_samenode_gets_total", result)
}

// counter reads a counter of the default registry by its result label.
func counter(t *testing.T, name, result string) float64 {
	t.Helper()
	mfs, err := prometheus.DefaultGatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.Metric {
			for _, l := range m.Label {
				if l.GetName() == "result" && l.GetValue() == result {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// TestSameNodePath: a consumer on the producer's node receives the object
// as a memfd (the samenode counter moves, the producer's socket is in the
// node directory); one on another node pulls it over TCP; both functions
// read the same bytes from their input file.
func TestSameNodePath(t *testing.T) {
	keyFile := filepath.Join(t.TempDir(), "keys.json")
	key := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{3}, 32))
	if err := os.WriteFile(keyFile, []byte(`{"active":"k1","keys":{"k1":"`+key+`"}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "sn") // short: socket paths are at most 107 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := nodedir.Prepare(dir); err != nil {
		t.Fatal(err)
	}
	startOn := func(node, uid string) *Sidecar {
		s := New(Config{Namespace: "ns", PodIP: "127.0.0.1", DataplanePort: servers.FreePort(t), ShmDir: t.TempDir(),
			MemoryLimit: 64 << 20, InlineThreshold: 1024, ObjectTTL: time.Minute, KeyFile: keyFile,
			SameNode: SameNodeConfig{Dir: dir, Node: node, PodUID: uid}})
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		if err := s.Start(ctx); err != nil {
			t.Fatal(err)
		}
		return s
	}
	producer := startOn("node-a", "0b6f6a4e-1c1d-4f7e-9a7e-2f4d1c1b8e11")
	near := startOn("node-a", "1b6f6a4e-1c1d-4f7e-9a7e-2f4d1c1b8e12")
	far := startOn("node-b", "2b6f6a4e-1c1d-4f7e-9a7e-2f4d1c1b8e13")
	if _, err := os.Stat(filepath.Join(dir, "0b6f6a4e-1c1d-4f7e-9a7e-2f4d1c1b8e11.sock")); err != nil {
		t.Fatalf("producer's socket: %v", err)
	}
	big := bytes.Repeat([]byte("0123456789"), 300_000) // 3 MB
	pfn := httptest.NewServer(producer.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		out, _ := json.Marshal(invocation.Outputs{Objects: []invocation.Object{{Bucket: "b", Key: "big", Inline: big}}})
		w.Header().Set("Content-Type", invocation.OutputsContentType)
		w.Write(out)
	})))
	defer pfn.Close()
	resp, body := post(t, pfn.URL, invocation.Envelope{Namespace: "ns", Function: "p", Session: "s1", Invocation: "i1"})
	if resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	outs, err := invocation.DecodeOutputs(body)
	if err != nil {
		t.Fatal(err)
	}
	r := outs.Objects[0]
	consume := func(s *Sidecar) []byte {
		var got []byte
		fn := httptest.NewServer(s.Wrap(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			env, err := invocation.Decode(req.Body)
			if err != nil {
				http.Error(w, err.Error(), 400)
				return
			}
			got, _ = os.ReadFile(filepath.Join(s.cfg.ShmDir, env.Objects[0].Path))
			w.Write([]byte("ok"))
		})))
		defer fn.Close()
		resp, body := post(t, fn.URL, invocation.Envelope{Namespace: "ns", Function: "c", Session: "s1", Invocation: "i2",
			Objects: []invocation.Object{{Bucket: "b", Key: "big", Ref: r.Ref, Size: r.Size}}})
		if resp.StatusCode != 200 {
			t.Fatalf("%d %s", resp.StatusCode, body)
		}
		return got
	}
	tcp := func() float64 { return counter(t, "ziptrail_dataplane_pulls_total", "ok") }
	ok0, na0, tcp0 := samenodeGets(t, "ok"), samenodeGets(t, "not_applicable"), tcp()
	if got := consume(near); !bytes.Equal(got, big) {
		t.Fatalf("same node: got %d bytes", len(got))
	}
	if ok := samenodeGets(t, "ok"); ok != ok0+1 {
		t.Errorf("same-node gets ok %v -> %v: the object did not come as a memfd", ok0, ok)
	}
	if n := tcp(); n != tcp0 {
		t.Errorf("TCP pulls %v -> %v: the same-node consumer pulled over TCP", tcp0, n)
	}
	if got := consume(far); !bytes.Equal(got, big) {
		t.Fatalf("other node: got %d bytes", len(got))
	}
	if ok, na, n := samenodeGets(t, "ok"), samenodeGets(t, "not_applicable"), tcp(); ok != ok0+1 || na != na0+1 || n != tcp0+1 {
		t.Errorf("other node: ok %v -> %v, not_applicable %v -> %v, TCP pulls %v -> %v; want the TCP pull", ok0, ok, na0, na, tcp0, n)
	}
}

// TestSameNodeLocalAPIPut: an object a function puts through its local API
// (not only one it returns) carries its producer's node, so a get through
// the local API of a pod on the same node takes the memfd, not TCP.
func TestSameNodeLocalAPIPut(t *testing.T) {
	sameNodePod := sameNodePods(t, 4)
	pod := func(uid string) *localapi.Client {
		s, c := sameNodePod(uid)
		c.InlineThreshold = s.cfg.InlineThreshold
		return c
	}
	producer := pod("3b6f6a4e-1c1d-4f7e-9a7e-2f4d1c1b8e14")
	consumer := pod("4b6f6a4e-1c1d-4f7e-9a7e-2f4d1c1b8e15")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	big := bytes.Repeat([]byte("abcdefghij"), 300_000) // 3 MB: a file, not inline
	r, err := producer.Put(ctx, big, 1)
	if err != nil {
		t.Fatal(err)
	}
	tcp := func() float64 { return counter(t, "ziptrail_dataplane_pulls_total", "ok") }
	ok0, tcp0 := samenodeGets(t, "ok"), tcp()
	got, err := consumer.Get(ctx, r)
	if err != nil || !bytes.Equal(got, big) {
		t.Fatalf("get on the same node: %d bytes, %v", len(got), err)
	}
	if ok := samenodeGets(t, "ok"); ok != ok0+1 {
		t.Errorf("same-node gets ok %v -> %v: the put object did not come as a memfd", ok0, ok)
	}
	if n := tcp(); n != tcp0 {
		t.Errorf("TCP pulls %v -> %v: the same-node consumer pulled over TCP", tcp0, n)
	}
}

// TestSameNodeSDKInPlace: a function that writes its object into an
// Alloc'd buffer hands the sidecar a sealed memfd (the local API's object
// socket), which the producer serves to its node as it is (adopted: held
// before any read, no copy); a consumer on the node gets that memfd passed
// on to its function (no file in its directory, no TCP pull). A memfd
// that is not sealed is refused by the real sidecar.
func TestSameNodeSDKInPlace(t *testing.T) {
	pod := sameNodePods(t, 5)
	ps, producer := pod("5b6f6a4e-1c1d-4f7e-9a7e-2f4d1c1b8e16")
	cs, consumer := pod("6b6f6a4e-1c1d-4f7e-9a7e-2f4d1c1b8e17")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	big := bytes.Repeat([]byte("klmnopqrst"), 300_000)
	buf, err := producer.Alloc(ctx, len(big))
	if err != nil {
		t.Fatal(err)
	}
	copy(buf.Data, big)
	resp, err := buf.Put(ctx, &sidecarv1.PutRequest{Reads: 1})
	if err != nil {
		t.Fatal(err)
	}
	if n := ps.sameNode.Cached(); n != 1 {
		t.Fatalf("the producer's same-node server holds %d memfds before any read, want the adopted one", n)
	}
	tcp := func() float64 { return counter(t, "ziptrail_dataplane_pulls_total", "ok") }
	passed := func() float64 { return counter(t, "ziptrail_localapi_object_socket_total", "get_memfd") }
	ok0, tcp0, passed0 := samenodeGets(t, "ok"), tcp(), passed()
	_, m, err := consumer.GetMapped(ctx, resp.GetRef())
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(m.Data, big) {
		t.Fatalf("got %d bytes, not the object", len(m.Data))
	}
	if ok, n, p := samenodeGets(t, "ok"), tcp(), passed(); ok != ok0+1 || n != tcp0 || p != passed0+1 {
		t.Errorf("same-node gets %v -> %v, TCP pulls %v -> %v, memfds passed to the function %v -> %v", ok0, ok, tcp0, n, passed0, p)
	}
	if names, _ := os.ReadDir(cs.cfg.ShmDir); len(names) != 0 {
		t.Errorf("the consumer's object directory holds %d files: the memfd was copied", len(names))
	}
	m.Close()

	// A hostile function: an unsealed memfd is refused with its class.
	fd, err := unix.MemfdCreate("x", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	_ = unix.Ftruncate(fd, 1<<20)
	conn, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: localapi.ObjectSocket(ps.cfg.APISocket), Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	msg := []byte("ZTO1\x02")
	msg = binary.LittleEndian.AppendUint32(msg, 1)
	msg = binary.LittleEndian.AppendUint64(msg, 0)
	msg = binary.LittleEndian.AppendUint64(msg, 1<<20)
	msg = binary.LittleEndian.AppendUint16(msg, 0)
	if _, _, err := conn.WriteMsgUnix(msg, unix.UnixRights(fd), nil); err != nil {
		t.Fatal(err)
	}
	out := make([]byte, 4096)
	n, err := conn.Read(out)
	if err != nil || n < 5 || out[4] != 1 || !bytes.Contains(out[:n], []byte(localapi.ReasonBadPayload)) || !bytes.Contains(out[:n], []byte("not sealed")) {
		t.Fatalf("unsealed memfd: %q, %v; want a BAD_PAYLOAD error", out[:n], err)
	}
	if n := ps.Store.Len(); n != 0 {
		t.Errorf("the producer stores %d objects after the refused put", n)
	}
}

// sameNodePods starts sidecars of pods on one node ("node-a", a same-node
// directory of their own), with reference keys made of keyByte; each
// returns the pod's sidecar and a client of its local API.
func sameNodePods(t *testing.T, keyByte byte) func(uid string) (*Sidecar, *localapi.Client) {
	t.Helper()
	keyFile := filepath.Join(t.TempDir(), "keys.json")
	key := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{keyByte}, 32))
	if err := os.WriteFile(keyFile, []byte(`{"active":"k1","keys":{"k1":"`+key+`"}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "sn")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := nodedir.Prepare(dir); err != nil {
		t.Fatal(err)
	}
	return func(uid string) (*Sidecar, *localapi.Client) {
		sock, err := os.MkdirTemp("", "zt")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = os.RemoveAll(sock) })
		s := New(Config{Namespace: "ns", PodIP: "127.0.0.1", DataplanePort: servers.FreePort(t), ShmDir: shmDir(t),
			MemoryLimit: 64 << 20, InlineThreshold: 1024, ObjectTTL: time.Minute, KeyFile: keyFile,
			APISocket: filepath.Join(sock, "sidecar.sock"), SameNode: SameNodeConfig{Dir: dir, Node: "node-a", PodUID: uid}})
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		if err := s.Start(ctx); err != nil {
			t.Fatal(err)
		}
		c, err := localapi.Dial(s.cfg.APISocket, s.cfg.ShmDir)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return s, c
	}
}
