package dispatch

import (
	"net/http"
	"strings"
)

// What a controller asks of the API server: NewClient's client counts every request it sends
// by verb (kube_dispatch_api_requests_total{controller, verb}, the verbs as the API server's
// audit log names them), labelled with the controller whose reconcile sent it. Divided by
// controller_runtime_reconcile_total, it is what a reconcile costs the API server, the figure
// a controller without a cache is judged by.

// countingTransport counts the requests it carries.
type countingTransport struct {
	next http.RoundTripper
}

func countRequests(next http.RoundTripper) http.RoundTripper {
	if next == nil {
		next = http.DefaultTransport
	}
	return &countingTransport{next: next}
}

func (t *countingTransport) RoundTrip(request *http.Request) (*http.Response, error) {
	controller := ""
	if d := deliveryFrom(request.Context()); d != nil {
		controller = d.metrics.controller
	}
	register()
	apiRequests.WithLabelValues(controller, verbOf(request)).Inc()
	return t.next.RoundTrip(request)
}

// verbOf names a request to the API server as its audit log does: get, list, watch, create,
// update, patch, delete or deletecollection (other: a path that names no resource).
func verbOf(request *http.Request) string {
	switch request.Method {
	case http.MethodPost:
		return "create"
	case http.MethodPut:
		return "update"
	case http.MethodPatch:
		return "patch"
	}
	collection, ok := namesCollection(request.URL.Path)
	switch {
	case !ok:
		return "other"
	case request.Method == http.MethodDelete && collection:
		return "deletecollection"
	case request.Method == http.MethodDelete:
		return "delete"
	case request.URL.Query().Get("watch") == "true" || request.URL.Query().Get("watch") == "1":
		return "watch"
	case collection:
		return "list"
	default:
		return "get"
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
	// A namespaced resource: namespaces/<namespace>/<resource>[/<name>...]; namespaces and
	// namespaces/<name> are the Namespace resource itself.
	if len(parts) >= 3 && parts[0] == "namespaces" {
		parts = parts[2:]
	}
	return len(parts) == 1, len(parts) >= 1 && parts[0] != ""
}
