package controllers

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestEventNoteFitsTheAPILimit(t *testing.T) {
	for _, s := range []string{"short", strings.Repeat("x", maxEventNote), strings.Repeat("é", 700), strings.Repeat("function f-17 not ready; ", 100)} {
		got := eventNote(s)
		if len(got) > maxEventNote || !utf8.ValidString(got) {
			t.Fatalf("eventNote(%d bytes) = %d bytes, valid UTF-8 %v", len(s), len(got), utf8.ValidString(got))
		}
		if len(s) <= maxEventNote && got != s {
			t.Fatalf("a note within the limit changed: %q", got)
		}
	}
}
