package dispatch

import (
	"net/http"
	"net/url"
	"testing"
)

// Requests are named by the verbs the API server's audit log gives them.
func TestRequestsAreCountedByTheAPIServersVerbs(t *testing.T) {
	for _, c := range []struct{ method, url, verb string }{
		{"GET", "/api/v1/namespaces/ns/configmaps/a", "get"},
		{"GET", "/api/v1/namespaces/ns/configmaps", "list"},
		{"GET", "/api/v1/configmaps", "list"},
		{"GET", "/api/v1/namespaces/ns/configmaps?watch=true&resourceVersion=5", "watch"},
		{"GET", "/apis/apps/v1/namespaces/ns/deployments/d/status", "get"},
		{"GET", "/apis/apps/v1/namespaces/ns/deployments", "list"},
		{"GET", "/api/v1/namespaces/ns", "get"},
		{"GET", "/api/v1/namespaces", "list"},
		{"GET", "/apis/example.dev/v1/widgets/w", "get"},
		{"POST", "/api/v1/namespaces/ns/configmaps", "create"},
		{"PUT", "/api/v1/namespaces/ns/configmaps/a", "update"},
		{"PATCH", "/api/v1/namespaces/ns/configmaps/a", "patch"},
		{"DELETE", "/api/v1/namespaces/ns/configmaps/a", "delete"},
		{"DELETE", "/api/v1/namespaces/ns/configmaps", "deletecollection"},
		{"GET", "/version", "other"},
		{"GET", "/apis/apps/v1", "other"},
	} {
		u, err := url.Parse(c.url)
		if err != nil {
			t.Fatal(err)
		}
		if got := verbOf(&http.Request{Method: c.method, URL: u}); got != c.verb {
			t.Errorf("%s %s: %s, want %s", c.method, c.url, got, c.verb)
		}
	}
}
