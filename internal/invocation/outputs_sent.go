package invocation

import (
	"net/http"
	"strconv"
)

// HeaderOutputsSent, on a function's response, is how many distinct objects
// (bucket/key) the function sent through its sidecar's local API during the
// invocation. The sidecar reports those to the operator on their own, over
// the control stream, possibly after the response; the operator counts them
// before it treats the invocation as finished.
const HeaderOutputsSent = "Ziptrail-Outputs-Sent"

// MaxOutputsSent bounds HeaderOutputsSent: a larger count is refused, so a
// forged header cannot make a session wait for outputs that never come
// beyond what one invocation can plausibly send.
const MaxOutputsSent = 1 << 20

// OutputsSent reads HeaderOutputsSent: 0 when absent or not a count in
// range.
func OutputsSent(h http.Header) int {
	n, err := strconv.Atoi(h.Get(HeaderOutputsSent))
	if err != nil || n < 0 || n > MaxOutputsSent {
		return 0
	}
	return n
}
