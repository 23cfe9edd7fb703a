package invocation

import (
	"net/http"
	"strconv"
	"strings"
)

// HeaderOutcomeKept, on a sidecar's answer to an invocation the operator's
// dispatcher sent, names the report of its outcome that the sidecar keeps
// unsent: "<pod>/<id>", the pod's name and an id in hex. The operator,
// having applied the answer, releases the id to that pod (the control
// stream's Saved message) once a saved checkpoint holds it; the sidecar
// sends the report only when no release comes (docs/guarantees.md). Only
// the sidecar sets it (it removes it from the function's answers).
const HeaderOutcomeKept = "Ziptrail-Outcome-Kept"

// HeaderKeepReport, on a request, asks the receiving sidecar to keep the
// report of its outcome for a release (HeaderOutcomeKept): the operator's
// dispatcher sets it, as the one caller that applies answers and releases
// them. Other callers (a function's own invoke, a delegated firing) leave
// the report to be sent at once.
const HeaderKeepReport = "Ziptrail-Keep-Report"

// FormatKept is HeaderOutcomeKept's value.
func FormatKept(pod string, id uint64) string {
	return pod + "/" + strconv.FormatUint(id, 16)
}

// ParseKept reads HeaderOutcomeKept from h; ok is false when it is absent
// or malformed (nothing to release: the sidecar sends the report itself).
func ParseKept(h http.Header) (pod string, id uint64, ok bool) {
	v := h.Get(HeaderOutcomeKept)
	if v == "" || len(v) > 253+1+16 {
		return "", 0, false
	}
	pod, hex, found := strings.Cut(v, "/")
	if !found || pod == "" || strings.Contains(hex, "/") {
		return "", 0, false
	}
	id, err := strconv.ParseUint(hex, 16, 64)
	if err != nil || id == 0 {
		return "", 0, false
	}
	return pod, id, true
}
