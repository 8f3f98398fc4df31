package dispatch

import (
	"net/http"
	"net/url"
	"testing"
)

// Requests are named by the Rust SDK's verbs; those that name no resource are not counted.
func TestRequestsAreCountedByTheirVerbs(t *testing.T) {
	for _, c := range []struct{ method, url, prefix, verb string }{
		{"GET", "/api/v1/namespaces/ns/configmaps/a", "", "get"},
		{"GET", "/api/v1/namespaces/ns/configmaps", "", "list"},
		{"GET", "/api/v1/configmaps", "", "list"},
		{"GET", "/api/v1/namespaces/ns/configmaps?watch=true&resourceVersion=5", "", "watch"},
		{"GET", "/apis/apps/v1/namespaces/ns/deployments/d/status", "", "get"},
		{"GET", "/apis/apps/v1/namespaces/ns/deployments", "", "list"},
		{"GET", "/api/v1/namespaces/ns", "", "get"},
		{"GET", "/api/v1/namespaces/ns/status", "", "get"},
		{"GET", "/api/v1/namespaces", "", "list"},
		{"GET", "/apis/example.dev/v1/widgets/w", "", "get"},
		{"POST", "/api/v1/namespaces/ns/configmaps", "", "create"},
		{"PUT", "/api/v1/namespaces/ns/configmaps/a", "", "update"},
		{"PATCH", "/api/v1/namespaces/ns/configmaps/a", "", "patch"},
		{"DELETE", "/api/v1/namespaces/ns/configmaps/a", "", "delete"},
		{"DELETE", "/api/v1/namespaces/ns/configmaps", "", "delete"},
		// Behind a proxy that serves the API server under a path.
		{"GET", "/k8s/clusters/c-1/api/v1/namespaces/ns/configmaps/a", "/k8s/clusters/c-1", "get"},
		{"GET", "/k8s/clusters/c-1/apis/apps/v1/deployments", "/k8s/clusters/c-1/", "list"},
		// Not counted.
		{"GET", "/version", "", ""},
		{"GET", "/apis/apps/v1", "", ""},
		{"HEAD", "/api/v1/namespaces/ns/configmaps/a", "", ""},
		{"GET", "/elsewhere/api/v1/configmaps", "/k8s", ""},
	} {
		u, err := url.Parse(c.url)
		if err != nil {
			t.Fatal(err)
		}
		transport := countRequests(c.prefix)(nil).(*countingTransport)
		verb, counted := verbOf(&http.Request{Method: c.method, URL: u}, transport.prefix)
		if verb != c.verb || counted != (c.verb != "") {
			t.Errorf("%s %s (prefix %q): %q, %v; want %q", c.method, c.url, c.prefix, verb, counted, c.verb)
		}
	}
}

func TestTheHostsPathIsThePrefix(t *testing.T) {
	for host, want := range map[string]string{
		"https://10.0.0.1:6443":                   "",
		"https://rancher.example/k8s/clusters/c1": "/k8s/clusters/c1",
		"10.0.0.1:6443":                           "",
	} {
		if got := hostPath(host); got != want {
			t.Errorf("hostPath(%q) = %q, want %q", host, got, want)
		}
	}
}
