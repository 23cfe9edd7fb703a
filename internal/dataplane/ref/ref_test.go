package ref

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"
)

var now = time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)

func keyring(t testing.TB, ns string, ids ...string) *Keyring {
	t.Helper()
	keys := map[string][]byte{}
	for i, id := range ids {
		keys[id] = bytes.Repeat([]byte{byte(i + 1)}, 32)
	}
	k, err := NewKeyring(ns, keys, ids[len(ids)-1])
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func TestSealOpen(t *testing.T) {
	k := keyring(t, "team-a", "k1")
	rec := Record{Addr: "10.0.0.7:9091", Key: "obj-42", Expires: now.Add(time.Minute), Reads: 3}
	s, err := k.Seal(rec)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(s, Prefix) || strings.Contains(s, "10.0.0.7") {
		t.Fatalf("reference %q must be opaque", s)
	}
	got, err := k.Open(s, now)
	if err != nil {
		t.Fatal(err)
	}
	rec.Namespace = "team-a"
	if got.Addr != rec.Addr || got.Key != rec.Key || got.Namespace != rec.Namespace || !got.Expires.Equal(rec.Expires) || got.Reads != 3 {
		t.Errorf("got %+v want %+v", got, rec)
	}
}

func TestBadReferences(t *testing.T) {
	k := keyring(t, "team-a", "k1")
	good, _ := k.Seal(Record{Addr: "a:1", Key: "k", Expires: now.Add(time.Minute), Reads: 1})
	expired, _ := k.Seal(Record{Addr: "a:1", Key: "k", Expires: now, Reads: 1})
	foreign, _ := keyring(t, "team-b", "k1").Seal(Record{Addr: "a:1", Key: "k", Expires: now.Add(time.Minute)})
	otherKey, _ := keyring(t, "team-a", "k9").Seal(Record{Addr: "a:1", Key: "k", Expires: now.Add(time.Minute)})
	flip := []byte(good)
	// Change one ciphertext character to another valid base64url one.
	if flip[len(flip)-5] == 'A' {
		flip[len(flip)-5] = 'B'
	} else {
		flip[len(flip)-5] = 'A'
	}
	for name, tc := range map[string]struct {
		ref  string
		want error
	}{
		"no prefix":       {"abc", ErrMalformed},
		"not base64":      {Prefix + "!!!", ErrMalformed},
		"truncated":       {good[:12], ErrMalformed},
		"empty":           {Prefix, ErrMalformed},
		"tampered":        {string(flip), ErrTampered},
		"expired":         {expired, ErrExpired},
		"unknown key":     {otherKey, ErrUnknownKey},
		"other namespace": {foreign, ErrForeign},
	} {
		if _, err := k.Open(tc.ref, now); !errors.Is(err, tc.want) {
			t.Errorf("%s: got %v, want %v", name, err, tc.want)
		}
	}
}

func TestRotation(t *testing.T) {
	k := keyring(t, "ns", "k1")
	old, _ := k.Seal(Record{Addr: "a:1", Key: "k", Expires: now.Add(time.Hour)})
	if err := k.Set(map[string][]byte{"k1": bytes.Repeat([]byte{1}, 32), "k2": bytes.Repeat([]byte{2}, 32)}, "k2"); err != nil {
		t.Fatal(err)
	}
	if _, err := k.Open(old, now); err != nil {
		t.Errorf("a reference sealed before rotation: %v", err)
	}
	if err := k.Set(map[string][]byte{"k2": bytes.Repeat([]byte{2}, 32)}, "k2"); err != nil {
		t.Fatal(err)
	}
	if _, err := k.Open(old, now); !errors.Is(err, ErrUnknownKey) {
		t.Errorf("after the old key is retired: %v", err)
	}
	if err := k.Set(map[string][]byte{"k": []byte("short")}, "k"); err == nil {
		t.Error("a 5-byte key was accepted")
	}
}

// FuzzOpen feeds arbitrary strings to the decoder: it must never panic, and
// anything it accepts must be a reference it could have sealed.
func FuzzOpen(f *testing.F) {
	k := keyring(f, "ns", "k1")
	good, _ := k.Seal(Record{Addr: "10.1.2.3:9091", Key: "obj", Expires: now.Add(time.Hour), Reads: 2})
	for _, s := range []string{good, Prefix, "zt1.AAAA", "zt1." + strings.Repeat("A", 200), "", good[:len(good)-3]} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := k.Open(s, now)
		if err == nil && (r.Namespace != "ns" || !r.Expires.After(now)) {
			t.Fatalf("accepted %q as %+v", s, r)
		}
	})
}

// TestNodeFields: the same-node fields round-trip, and a record without
// them encodes byte for byte as before they existed (older references
// still open, and references of producers without the node directory
// still open in older sidecars).
func TestNodeFields(t *testing.T) {
	k := keyring(t, "team-a", "k1")
	rec := Record{Addr: "10.0.0.7:9192", Key: "obj", Expires: now.Add(time.Minute), Reads: 1, Node: "node-b", Pod: "6b1d2c9e-0000-4000-8000-000000000001"}
	s, err := k.Seal(rec)
	if err != nil {
		t.Fatal(err)
	}
	got, err := k.Open(s, now)
	if err != nil {
		t.Fatal(err)
	}
	if got.Node != rec.Node || got.Pod != rec.Pod || got.Key != rec.Key || got.Reads != 1 {
		t.Fatalf("got %+v want %+v", got, rec)
	}
	plain := Record{Addr: "a:1", Key: "k", Namespace: "ns", Expires: time.Unix(5, 0), Reads: 2}
	legacy := []byte{3, 'a', ':', '1', 1, 'k', 2, 'n', 's', 0, 0, 0, 1, 0x2a, 0x05, 0xf2, 0, 0, 0, 0, 2}
	if e := encode(plain); !bytes.Equal(e, legacy) {
		t.Fatalf("a record without node fields encodes as %x, want the original format %x", e, legacy)
	}
	// Trailing garbage after the extension is refused.
	if _, err := decode(append(encode(rec), 0)); !errors.Is(err, ErrMalformed) {
		t.Fatalf("trailing byte: %v, want ErrMalformed", err)
	}
}
