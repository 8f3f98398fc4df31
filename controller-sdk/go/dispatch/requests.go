package dispatch

import (
	"net/http"
	"strings"

	"github.com/kube-dispatch/kube-dispatch/controller-sdk/go/internal/engine"
)

// What a controller asks of the API server: NewClient's client counts every request for a
// resource it sends by verb (kube_dispatch_api_requests_total{controller, verb}, with the Rust
// SDK's verbs: get, list, watch, create, update, patch, delete, a collection's deletion
// counted as delete), labelled with the controller whose reconcile sent it (empty outside a
// reconcile); discovery and other requests that name no resource are not counted. Divided by
// controller_runtime_reconcile_total, it is what a reconcile costs the API server, the figure a
// controller without a cache is judged by.

// countingTransport counts the requests it carries.
type countingTransport struct {
	next http.RoundTripper
	// prefix is the path the API server is served under (a proxy's), from the host's URL.
	prefix string
}

// countRequests wraps next (nil: the default transport) for an API server whose host URL has
// the path prefix (usually empty).
func countRequests(prefix string) func(http.RoundTripper) http.RoundTripper {
	return func(next http.RoundTripper) http.RoundTripper {
		if next == nil {
			next = http.DefaultTransport
		}
		return &countingTransport{next: next, prefix: strings.TrimSuffix(prefix, "/")}
	}
}

func (t *countingTransport) RoundTrip(request *http.Request) (*http.Response, error) {
	if verb, ok := verbOf(request, t.prefix); ok {
		controller := ""
		if d := deliveryFrom(request.Context()); d != nil {
			controller = d.Metrics.Controller
		}
		engine.CountAPIRequest(controller, verb)
	}
	return t.next.RoundTrip(request)
}

// WrappedRoundTripper is the transport it wraps (client-go looks through wrappers with it).
func (t *countingTransport) WrappedRoundTripper() http.RoundTripper { return t.next }

// CloseIdleConnections closes the wrapped transport's idle connections.
func (t *countingTransport) CloseIdleConnections() {
	if closer, ok := t.next.(interface{ CloseIdleConnections() }); ok {
		closer.CloseIdleConnections()
	}
}

// verbOf names a request to the API server under prefix by its verb; false for a request that
// names no resource (discovery, health) or has a method no verb is.
func verbOf(request *http.Request, prefix string) (string, bool) {
	switch request.Method {
	case http.MethodPost:
		return "create", true
	case http.MethodPut:
		return "update", true
	case http.MethodPatch:
		return "patch", true
	case http.MethodGet, http.MethodDelete:
	default:
		return "", false
	}
	path, found := strings.CutPrefix(request.URL.Path, prefix)
	if !found {
		return "", false
	}
	collection, ok := namesCollection(path)
	switch {
	case !ok:
		return "", false
	case request.Method == http.MethodDelete:
		return "delete", true
	case request.URL.Query().Get("watch") == "true" || request.URL.Query().Get("watch") == "1":
		return "watch", true
	case collection:
		return "list", true
	default:
		return "get", true
	}
}

// namesCollection says whether path (/api/v1/... or /apis/group/version/...) names a
// collection of resources rather than one object; false ok for a path that names neither.
func namesCollection(path string) (collection, ok bool) {
	parts := strings.Split(strings.Trim(path, "/"), "/")
	switch {
	case len(parts) >= 2 && parts[0] == "api":
		parts = parts[2:]
	case len(parts) >= 3 && parts[0] == "apis":
		parts = parts[3:]
	default:
		return false, false
	}
	// A namespaced resource: namespaces/<namespace>/<resource>[/<name>...]; namespaces,
	// namespaces/<name> and its subresources are the Namespace resource itself.
	namespaceSubresource := len(parts) == 3 && (parts[2] == "status" || parts[2] == "finalize")
	if len(parts) >= 3 && parts[0] == "namespaces" && !namespaceSubresource {
		parts = parts[2:]
	}
	return len(parts) == 1, len(parts) >= 1 && parts[0] != ""
}
