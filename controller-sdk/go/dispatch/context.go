package dispatch

import (
	"context"
	"errors"
	"fmt"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/kube-dispatch/kube-dispatch/controller-sdk/go/internal/engine"
	pb "github.com/kube-dispatch/kube-dispatch/controller-sdk/go/internal/wire/kubedispatch/v1"
)

// MaxMemoBytes is the longest memo the dispatcher keeps for an object.
const MaxMemoBytes = 512

// reconciler runs the user's Reconciler on a delivery: its context ends at the delivery's
// deadline and when the session that delivered it is lost (context.Cause is then errFenced),
// carries the delivery (Memo, Children, and the object for NewClient's Get) and the reconcile's
// span, and what it returns becomes the delivery's ack.
type reconciler struct {
	inner  reconcile.Reconciler
	queue  *engine.Queue
	tracer trace.Tracer
}

// traceContext reads the W3C trace context a request carries.
var traceContext propagation.TraceContext

type deliveryKey struct{}

func (w *reconciler) Reconcile(ctx context.Context, request reconcile.Request) (reconcile.Result, error) {
	d := w.queue.Delivery(request.NamespacedName)
	if d == nil {
		// Not from the tier (a test calling the controller's Reconcile directly).
		return w.inner.Reconcile(ctx, request)
	}
	// The worker's context ends as soon as the manager stops, but a graceful stop lets running
	// reconciles finish within their deadlines (the sessions renew meanwhile, then
	// acknowledge them): the reconcile keeps the context's values and ends with its delivery.
	ctx, cancel := context.WithCancelCause(context.WithValue(context.WithoutCancel(ctx), deliveryKey{}, d))
	defer cancel(nil)
	stop := context.AfterFunc(d.Ctx, func() { cancel(context.Cause(d.Ctx)) })
	defer stop()
	ctx, span := w.startSpan(ctx, d)
	// controller-runtime's logger names the controller, the object and the reconcileID.
	log := logf.FromContext(ctx).WithValues("key", d.Request.GetKey(), "dispatcher", d.Session.Address)
	defer func() {
		// A panic fails the delivery (controller-runtime recovers it, and Done finds no
		// outcome): the span and the log say so before it goes on up.
		if p := recover(); p != nil {
			span.SetStatus(codes.Error, fmt.Sprintf("panic: %v", p))
			span.End()
			log.V(1).Info("reconcile ended", "outcome", "failure", "panic", true)
			panic(p)
		}
		span.End()
	}()
	log.V(1).Info("reconcile started", "reason", engine.ReasonLabel(d.Request.GetReason()), "resourceVersion", d.Request.GetResourceVersion(), "attempt", d.Request.GetAttempt())
	result, err := w.inner.Reconcile(ctx, request)
	if err != nil {
		span.RecordError(err)
	}
	switch cause := context.Cause(d.Ctx); {
	case errors.Is(cause, context.DeadlineExceeded):
		d.Outcome = &pb.AckItem{Outcome: &pb.AckItem_Failure{Failure: &pb.Failure{Message: fmt.Sprintf("timed out after %v", d.Limit)}}}
	default:
		d.Outcome = engine.AckFor(result, err)
	}
	if failure := d.Outcome.GetFailure(); failure != nil {
		span.SetStatus(codes.Error, failure.GetMessage())
	}
	log.V(1).Info("reconcile ended", "outcome", outcomeLabel(d.Outcome), "fenced", errors.Is(context.Cause(d.Ctx), engine.ErrFenced))
	return result, err
}

// outcomeLabel names an ack's outcome for the logs: success, requeue or failure.
func outcomeLabel(ack *pb.AckItem) string {
	switch {
	case ack.GetRequeue() != nil:
		return "requeue"
	case ack.GetFailure() != nil:
		return "failure"
	default:
		return "success"
	}
}

// startSpan starts the reconcile's span: a child of the dispatcher's span for the change that
// queued the key when the request carries its trace context (the dispatcher exports traces),
// so one trace runs from the API server's event to the reconcile's writes; spans the
// Reconciler starts from its context are the reconcile's children.
func (w *reconciler) startSpan(ctx context.Context, d *engine.Delivery) (context.Context, trace.Span) {
	r := d.Request
	if parent := r.GetTraceparent(); parent != "" {
		ctx = traceContext.Extract(ctx, propagation.MapCarrier{"traceparent": parent})
	}
	return w.tracer.Start(ctx, "reconcile",
		trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(
			attribute.String("key", r.GetKey()),
			attribute.String("resource_version", r.GetResourceVersion()),
			attribute.String("reason", engine.ReasonLabel(r.GetReason())),
			attribute.Int("attempt", int(r.GetAttempt())),
			attribute.String("dispatcher", d.Session.Address),
		))
}

func deliveryFrom(ctx context.Context) *engine.Delivery {
	d, _ := ctx.Value(deliveryKey{}).(*engine.Delivery)
	return d
}

// Memo is what the last reconcile of this object in its group left with LeaveMemo, handed
// back by the dispatcher with this delivery (or what this reconcile left since); nil when none
// was left, when the object was recreated since, after a handover or a dispatcher restart. A
// reconcile that leaves none passes this one on.
func Memo(ctx context.Context) []byte {
	if d := deliveryFrom(ctx); d != nil {
		return d.Memo()
	}
	return nil
}

// LeaveMemo leaves memo (at most MaxMemoBytes; empty removes it) for the next delivery of this
// object: what a stateless reconcile needs to remember, such as fingerprints of the children
// it wrote, so the next reconcile can skip reading them. Call it from the reconcile.
func LeaveMemo(ctx context.Context, memo []byte) error {
	d := deliveryFrom(ctx)
	if d == nil {
		return errors.New("kube-dispatch: LeaveMemo outside a reconcile delivered by the tier")
	}
	if len(memo) > MaxMemoBytes {
		return fmt.Errorf("kube-dispatch: a memo holds at most %d bytes, not %d", MaxMemoBytes, len(memo))
	}
	d.LeaveMemo(memo)
	return nil
}

// Child is an object owned by the reconciled object, as the dispatcher's watch last showed it.
type Child struct {
	Group, Version, Kind string
	Namespace, Name      string
	UID                  string
	ResourceVersion      string
	// Body is the child as JSON at ResourceVersion, when the dispatcher sent it (it holds
	// children's bodies within its body pool, and the answer had room); empty otherwise. A
	// List of the children through an owner index takes it instead of reading the child.
	Body []byte
}

// Children are the objects of the Owns kinds whose controlling owner is the reconciled object,
// as the dispatcher knows them, at least as new as the change that caused the delivery.
// complete is false when that knowledge may lack some (before the dispatcher's first list
// ended, during a handover, or cut at the dispatcher's bound): then list them if it matters.
func Children(ctx context.Context) (children []Child, complete bool) {
	d := deliveryFrom(ctx)
	if d == nil {
		return nil, false
	}
	for _, c := range d.Request.GetChildren() {
		o := c.GetObject()
		children = append(children, Child{
			Group: o.GetGroup(), Version: o.GetVersion(), Kind: o.GetKind(),
			Namespace: o.GetNamespace(), Name: o.GetName(),
			UID: c.GetUid(), ResourceVersion: c.GetResourceVersion(), Body: c.GetObjectJson(),
		})
	}
	return children, d.Request.GetChildrenState() == pb.ChildrenState_CHILDREN_STATE_COMPLETE
}

// Delivery describes why and at which version a reconcile runs.
type Delivery struct {
	// Key is the request key (group/kind/namespace/name).
	Key string
	// Reason is why it was delivered: added, modified, deleted, resync, retry, requeue,
	// owned, referenced or triggered.
	Reason string
	// ResourceVersion is the version of the object the delivery is at least as new as.
	ResourceVersion string
	// Deleted says the object is gone.
	Deleted bool
	// Attempt counts the failed attempts before this one.
	Attempt uint32
}

// DeliveryOf describes the delivery a reconcile runs for; false outside one.
func DeliveryOf(ctx context.Context) (Delivery, bool) {
	d := deliveryFrom(ctx)
	if d == nil {
		return Delivery{}, false
	}
	r := d.Request
	return Delivery{
		Key:             r.GetKey(),
		Reason:          engine.ReasonLabel(r.GetReason()),
		ResourceVersion: r.GetResourceVersion(),
		Deleted:         r.GetDeleted(),
		Attempt:         r.GetAttempt(),
	}, true
}
