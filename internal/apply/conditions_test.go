package apply

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// Truncate never returns more than n bytes, never splits a character, and
// marks a cut when there is room for the mark.
func TestTruncate(t *testing.T) {
	for _, tt := range []struct {
		s    string
		n    int
		want string
	}{
		{"short", 10, "short"},
		{"abcdefgh", 6, "abc…"},
		{"ééééé", 6, "é…"}, {"ééééé", 7, "éé…"},
		{"abcdef", 2, "ab"},
		{"éé", 1, ""},
		{"abc", 0, ""},
	} {
		if got := Truncate(tt.s, tt.n); got != tt.want {
			t.Errorf("Truncate(%q, %d) = %q, want %q", tt.s, tt.n, got, tt.want)
		}
	}
}

func FuzzTruncate(f *testing.F) {
	f.Add(strings.Repeat("é", 40), 7)
	f.Fuzz(func(t *testing.T, s string, n int) {
		if n < 0 || !utf8.ValidString(s) {
			return
		}
		got := Truncate(s, n)
		if len(got) > n && len(s) > n || !utf8.ValidString(got) {
			t.Fatalf("Truncate(%q, %d) = %q", s, n, got)
		}
	})
}
