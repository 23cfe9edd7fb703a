package invocation

import (
	"errors"
	"strings"
	"testing"
)

func TestParseFence(t *testing.T) {
	for in, want := range map[string]Fence{
		"ziptrail:engine:snapshot/0":                                  {Key: "ziptrail:engine:snapshot", Generation: 0},
		"ziptrail:engine:ziptrail-engine.03-of-08/17179869185":        {Key: "ziptrail:engine:ziptrail-engine.03-of-08", Generation: 4<<32 + 1},
		"a/b/9223372036854775807":                                     {Key: "a/b", Generation: 1<<63 - 1},
		strings.Repeat("k", MaxFenceKeyBytes) + "/1":                  {Key: strings.Repeat("k", MaxFenceKeyBytes), Generation: 1},
		"ziptrail:engine:snapshot/0000000000000000000000000000000042": {Key: "ziptrail:engine:snapshot", Generation: 42},
	} {
		got, err := ParseFence(in)
		if err != nil || got != want {
			t.Errorf("ParseFence(%q) = %+v, %v; want %+v", in, got, err, want)
		}
	}
	for in, why := range map[string]string{
		"":                      "no \"/\"",
		"ziptrail:engine":       "no \"/\"",
		"/5":                    "key is empty",
		"k/":                    "generation is empty",
		"k/-1":                  "not a non-negative decimal",
		"k/+1":                  "not a non-negative decimal",
		"k/1.5":                 "not a non-negative decimal",
		"k/0x10":                "not a non-negative decimal",
		"k/ 1":                  "not a non-negative decimal",
		"k/9223372036854775808": "out of range",
		"a key/1":               "space or a control character",
		"k\x00/1":               "space or a control character",
		"k\x7f/1":               "space or a control character",
		strings.Repeat("k", MaxFenceKeyBytes+1) + "/1": "exceeds",
	} {
		_, err := ParseFence(in)
		if err == nil || !errors.Is(err, ErrMalformedFence) || !strings.Contains(err.Error(), why) ||
			!strings.Contains(err.Error(), "<checkpoint key>/<generation>") {
			t.Errorf("ParseFence(%q): %v; want a malformed fence error saying %q", in, err, why)
		}
	}
}

func FuzzParseFence(f *testing.F) {
	for _, s := range []string{"ziptrail:engine:snapshot/3", "a/b/c/1", "/", "k/-0", "k/99999999999999999999"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		fe, err := ParseFence(s)
		if err != nil {
			return
		}
		if fe.Key == "" || fe.Generation < 0 {
			t.Fatalf("ParseFence(%q) accepted %+v", s, fe)
		}
		// What is accepted travels again as the same fence.
		again, err := ParseFence(fe.String())
		if err != nil || again != fe {
			t.Fatalf("ParseFence(%q) = %+v; its String %q parses as %+v, %v", s, fe, fe.String(), again, err)
		}
	})
}
