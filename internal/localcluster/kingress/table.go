package kingress

import (
	"math/rand/v2"
	"net"
	"net/http"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/types"
)

// headerKV is one header name (canonical form) and its value.
type headerKV struct {
	name, value string
}

// split is one weighted backend of a route.
type split struct {
	backend       *Backend
	percent       int
	appendHeaders []headerKV
}

// route is one HTTPIngressPath: a path prefix, exact header matches and the
// weighted backends. Routes are immutable once built.
type route struct {
	ingress       types.NamespacedName
	path          string
	headers       []headerKV
	appendHeaders []headerKV
	rewriteHost   string
	splits        []split
	totalPercent  int
	// redirectHTTP answers plain-HTTP requests on the external listener
	// with a 301 to https (spec.httpOption: Redirected).
	redirectHTTP bool
}

// matches reports whether the request's path and headers select this route.
func (rt *route) matches(r *http.Request) bool {
	if !strings.HasPrefix(r.URL.Path, rt.path) {
		return false
	}
	for _, h := range rt.headers {
		if r.Header.Get(h.name) != h.value {
			return false
		}
	}
	return true
}

// pick chooses a split by its percent.
func (rt *route) pick() *split {
	if len(rt.splits) == 1 || rt.totalPercent <= 0 {
		return &rt.splits[0]
	}
	n := rand.IntN(rt.totalPercent)
	for i := range rt.splits {
		n -= rt.splits[i].percent
		if n < 0 {
			return &rt.splits[i]
		}
	}
	return &rt.splits[len(rt.splits)-1]
}

// wildcardHost is the key of the routes of a rule without hosts.
const wildcardHost = "*"

// Table is one listener's routing snapshot: routes per host, most specific
// path first. A Table is never modified after it is published.
type Table struct {
	hosts map[string][]*route
}

// newTable merges hosts → routes maps and sorts each host's routes by path
// length, longest first, keeping the given order among equal lengths (so a
// path with header matches stays ahead of its catch-all twin).
func newTable(parts ...map[string][]*route) *Table {
	t := &Table{hosts: map[string][]*route{}}
	for _, p := range parts {
		for h, rs := range p {
			t.hosts[h] = append(t.hosts[h], rs...)
		}
	}
	for _, rs := range t.hosts {
		sort.SliceStable(rs, func(i, j int) bool { return len(rs[i].path) > len(rs[j].path) })
	}
	return t
}

// lookup returns the route for a request, and whether its host is known.
func (t *Table) lookup(r *http.Request) (rt *route, hostKnown bool) {
	rs, ok := t.hosts[normalizeHost(r.Host)]
	if !ok {
		rs, ok = t.hosts[wildcardHost]
	}
	if !ok {
		return nil, false
	}
	for _, rt := range rs {
		if rt.matches(r) {
			return rt, true
		}
	}
	return nil, true
}

// normalizeHost lowercases a Host header and strips its port and trailing dot.
func normalizeHost(h string) string {
	if host, _, err := net.SplitHostPort(h); err == nil {
		h = host
	}
	h = strings.TrimSuffix(h, ".")
	return strings.ToLower(h)
}
