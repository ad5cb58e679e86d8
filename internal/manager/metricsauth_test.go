package manager

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
)

// A fake API server's reviews: token "good" is alice, "bad" is nobody,
// "broken" fails; alice may GET /metrics, nothing else.
func fakeGate(reviews, accesses *int) *gate {
	return &gate{
		review: func(_ context.Context, token string) (authnv1.TokenReviewStatus, error) {
			*reviews++
			switch token {
			case "good":
				return authnv1.TokenReviewStatus{Authenticated: true, User: authnv1.UserInfo{Username: "alice", Groups: []string{"g"}}}, nil
			case "broken":
				return authnv1.TokenReviewStatus{}, errors.New("API server down")
			}
			return authnv1.TokenReviewStatus{}, nil
		},
		access: func(_ context.Context, spec authzv1.SubjectAccessReviewSpec) (authzv1.SubjectAccessReviewStatus, error) {
			*accesses++
			a := spec.NonResourceAttributes
			return authzv1.SubjectAccessReviewStatus{Allowed: spec.User == "alice" && a.Verb == "get" && a.Path == "/metrics"}, nil
		},
	}
}

func TestMetricsGate(t *testing.T) {
	var reviews, accesses int
	g := fakeGate(&reviews, &accesses)
	for _, tc := range []struct {
		name, method, path, header string
		want                       int
	}{
		{"no token", "GET", "/metrics", "", http.StatusUnauthorized},
		{"not a bearer token", "GET", "/metrics", "Basic Zm9vOmJhcg==", http.StatusUnauthorized},
		{"empty bearer", "GET", "/metrics", "Bearer ", http.StatusUnauthorized},
		{"unknown token", "GET", "/metrics", "Bearer bad", http.StatusUnauthorized},
		{"review fails", "GET", "/metrics", "Bearer broken", http.StatusInternalServerError},
		{"allowed", "GET", "/metrics", "Bearer good", http.StatusOK},
		{"scheme in any case", "GET", "/metrics", "bearer good", http.StatusOK},
		{"another path", "GET", "/debug", "Bearer good", http.StatusForbidden},
		{"another verb", "POST", "/metrics", "Bearer good", http.StatusForbidden},
	} {
		req := httptest.NewRequest(tc.method, tc.path, nil)
		if tc.header != "" {
			req.Header.Set("Authorization", tc.header)
		}
		if code, _, _ := g.check(req); code != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, code, tc.want)
		}
	}
	reviews, accesses = 0, 0
	for range 3 {
		req := httptest.NewRequest("GET", "/metrics", nil)
		req.Header.Set("Authorization", "Bearer good")
		if code, _, _ := g.check(req); code != http.StatusOK {
			t.Fatalf("cached answer: %d", code)
		}
	}
	if reviews != 0 || accesses != 0 {
		t.Errorf("answers not cached: %d token reviews, %d access reviews for repeated scrapes", reviews, accesses)
	}
}

func TestTTLCacheStaysBounded(t *testing.T) {
	var c ttlCache[int]
	for i := range 3 * maxCached {
		c.put(string(rune(i)), i, tokenTTL)
	}
	if len(c.m) > maxCached {
		t.Fatalf("%d entries kept, want at most %d", len(c.m), maxCached)
	}
}
