package dispatch

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/kube-dispatch/kube-dispatch/controller-sdk/go/internal/engine"
	pb "github.com/kube-dispatch/kube-dispatch/controller-sdk/go/internal/wire/kubedispatch/v1"
)

// The reconcile's span continues the trace of the dispatcher's span for the change that queued
// the key, and the Reconciler's own spans are its children; a failed or panicked reconcile's
// span says so.
// A request without a trace context starts a trace of its own.
func TestTheReconcileSpanContinuesTheDeliveredTrace(t *testing.T) {
	const (
		traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
		spanID  = "00f067aa0ba902b7"
	)
	recorder := tracetest.NewSpanRecorder()
	provider := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(recorder))
	q := engine.NewQueue(2, engine.NewMetrics("test", "trace"))
	var inner trace.SpanContext
	w := &reconciler{queue: q, tracer: provider.Tracer(tracerName), inner: reconcile.Func(func(ctx context.Context, r reconcile.Request) (reconcile.Result, error) {
		_, span := provider.Tracer("user").Start(ctx, "write children")
		inner = span.SpanContext()
		span.End()
		switch r.Name {
		case "b":
			return reconcile.Result{}, errors.New("the API server refused")
		case "c":
			panic("nil map")
		}
		return reconcile.Result{}, nil
	})}
	s := engine.DetachedSession("dispatcher-0:7070")
	traced := tracedRequest(1, "a")
	traced.Traceparent = "00-" + traceID + "-" + spanID + "-01"
	traced.Reason = pb.Reason_REASON_MODIFIED
	q.Accept(s, []*pb.ReconcileRequest{traced, tracedRequest(2, "b"), tracedRequest(3, "c")}, time.Now().Add(time.Minute), time.Minute)

	for _, want := range []string{"a", "b", "c"} {
		item, _ := q.Get()
		if item.Name != want {
			t.Fatalf("got %v, want %s", item, want)
		}
		func() {
			// controller-runtime recovers a panic above the Reconciler.
			defer func() { _ = recover() }()
			_, _ = w.Reconcile(context.Background(), item)
		}()
		q.Done(item)
		spans := recorder.Ended()
		got := spans[len(spans)-1]
		if got.Name() != "reconcile" || got.SpanKind() != trace.SpanKindConsumer {
			t.Fatalf("span %q of kind %v", got.Name(), got.SpanKind())
		}
		if inner.TraceID() != got.SpanContext().TraceID() {
			t.Fatalf("the Reconciler's span is in trace %s, the reconcile's in %s", inner.TraceID(), got.SpanContext().TraceID())
		}
		switch want {
		case "a":
			if got.Parent().TraceID().String() != traceID || got.Parent().SpanID().String() != spanID || !got.Parent().IsRemote() {
				t.Fatalf("the reconcile's parent is %v, want the delivered %s/%s", got.Parent(), traceID, spanID)
			}
			if got.Status().Code != codes.Unset {
				t.Fatalf("a successful reconcile's span has status %v", got.Status())
			}
			attributes := map[string]string{}
			for _, a := range got.Attributes() {
				attributes[string(a.Key)] = a.Value.String()
			}
			if attributes["key"] != traced.GetKey() || attributes["reason"] != "modified" || attributes["dispatcher"] != "dispatcher-0:7070" {
				t.Fatalf("attributes: %v", attributes)
			}
		case "c":
			if got.Status().Code != codes.Error || got.Status().Description != "panic: nil map" {
				t.Fatalf("a panicked reconcile's span has status %v", got.Status())
			}
			if pending := s.Pending(); pending[len(pending)-1].GetFailure() == nil {
				t.Fatalf("a panicked reconcile was acknowledged %v", pending[len(pending)-1])
			}
		case "b":
			if got.Parent().IsValid() {
				t.Fatalf("a request without a trace context has parent %v", got.Parent())
			}
			if got.Status().Code != codes.Error || got.Status().Description != "the API server refused" {
				t.Fatalf("a failed reconcile's span has status %v", got.Status())
			}
		}
	}
}

// tracedRequest is a request for ConfigMap ns/name.
func tracedRequest(id uint64, name string) *pb.ReconcileRequest {
	return &pb.ReconcileRequest{
		DeliveryId: id,
		Key:        "/ConfigMap/ns/" + name,
		Object:     &pb.ObjectKey{Version: "v1", Kind: "ConfigMap", Namespace: "ns", Name: name},
	}
}
