package invocation

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// HeaderOwnerFence carries, on an invocation the operator's engine
// dispatches, the fence of the engine owner that sent it: its checkpoint
// key and the generation at which it claimed that checkpoint
// (Fence.String, "<checkpoint key>/<generation>"). Every new owner of a
// checkpoint key claims it at a higher generation, so a receiving sidecar
// that has seen a newer owner's fence for the key refuses an older one's
// invocations (409 with HeaderStaleOwner): a superseded owner stops
// dispatching at its next call rather than at its next save. Invocations
// without it (a producer's sidecar firing a delegated trigger, an older
// operator, a direct call) are not fenced.
const HeaderOwnerFence = "Ziptrail-Owner-Fence"

// HeaderStaleOwner is on a sidecar's 409 answer to an invocation whose
// owner fence is older than one it saw for the same checkpoint key: its
// value is that newer fence. The function did not run and the key was not
// recorded. Only the sidecar sets it (it removes it from the function's
// answers).
const HeaderStaleOwner = "Ziptrail-Stale-Owner"

// MaxFenceKeyBytes bounds a fence's checkpoint key.
const MaxFenceKeyBytes = 512

// Fence identifies one owner of an engine checkpoint: the checkpoint's
// key and the generation at which the owner claimed it.
type Fence struct {
	Key        string
	Generation int64
}

// String is the fence as HeaderOwnerFence carries it.
func (f Fence) String() string { return f.Key + "/" + strconv.FormatInt(f.Generation, 10) }

// ErrMalformedFence is the class of ParseFence's errors.
var ErrMalformedFence = errors.New("malformed owner fence")

// ParseFence reads a HeaderOwnerFence value: "<checkpoint key>/<generation>",
// the generation a non-negative decimal integer after the last "/", the
// key non-empty, at most MaxFenceKeyBytes, printable and without spaces.
func ParseFence(s string) (Fence, error) {
	bad := func(why string) (Fence, error) {
		return Fence{}, fmt.Errorf("invocation: %w %q: %s; want <checkpoint key>/<generation>, e.g. ziptrail:engine:snapshot/42",
			ErrMalformedFence, truncate(s, 80), why)
	}
	i := strings.LastIndexByte(s, '/')
	if i < 0 {
		return bad("no \"/\" before the generation")
	}
	key, num := s[:i], s[i+1:]
	switch {
	case key == "":
		return bad("the checkpoint key is empty")
	case len(key) > MaxFenceKeyBytes:
		return bad(fmt.Sprintf("the checkpoint key exceeds %d bytes", MaxFenceKeyBytes))
	case strings.ContainsFunc(key, func(r rune) bool { return r <= ' ' || r == 0x7f }):
		return bad("the checkpoint key has a space or a control character")
	case num == "":
		return bad("the generation is empty")
	case strings.ContainsFunc(num, func(r rune) bool { return r < '0' || r > '9' }):
		return bad("the generation is not a non-negative decimal integer")
	}
	gen, err := strconv.ParseInt(num, 10, 64)
	if err != nil {
		return bad("the generation is out of range")
	}
	return Fence{Key: key, Generation: gen}, nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
