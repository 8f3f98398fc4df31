package dispatch

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/types/known/durationpb"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/kube-dispatch/kube-dispatch/controller-sdk/go/internal/engine"
	pb "github.com/kube-dispatch/kube-dispatch/controller-sdk/go/internal/wire/kubedispatch/v1"
)

// DefaultLoadBalancer is where a replica registers unless told otherwise: the load balancer's
// Service as deploy/ installs it.
const DefaultLoadBalancer = "kube-dispatch-loadbalancer.kube-dispatch.svc:7071"

// PayloadMode says how much of the object a request carries.
type PayloadMode int

const (
	// PayloadFull carries the whole object when it fits the dispatcher's body budget; the
	// client of NewClient serves the reconcile's Get of it from the request.
	PayloadFull PayloadMode = iota
	// PayloadKeyOnly carries no object: the reconcile's Get reads it from the API server's
	// watch cache at the version delivered.
	PayloadKeyOnly
)

// Options say how a controller reaches the tier. The zero value registers with the load
// balancer named by KD_LOADBALANCER (else DefaultLoadBalancer), with the credentials the
// environment gives (CredentialsFromEnv).
type Options struct {
	// Group is the controller group: the replicas that share the work. Default: the
	// controller's name.
	Group string
	// ReplicaID is this replica's id within the group. Default: POD_NAME, else the host name
	// and process id.
	ReplicaID string
	// LoadBalancer is the load balancer's address (host:port). Default: KD_LOADBALANCER, else
	// DefaultLoadBalancer.
	LoadBalancer string
	// DispatcherService is the dispatchers' headless Service (host:port), looked up once
	// registration with the load balancer has failed for 10 s (no load balancer leads), and
	// every 5 s after that: the replica keeps polling the dispatchers assigned last and adds
	// those the Service names, so a dispatcher that joins meanwhile is polled too; the next
	// assignment replaces them. deploy/ installs it as
	// kube-dispatch-dispatcher.kube-dispatch.svc:7070. Default: KD_DISPATCHER_SERVICE, else
	// none (the replica polls only what it was assigned last).
	DispatcherService string
	// ResolveDispatchers looks up DispatcherService (default: DNS). For tests, and for
	// discovery other than DNS.
	ResolveDispatchers Resolver
	// Dispatchers, when set, are polled directly instead of asking the load balancer (tests,
	// a single dispatcher).
	Dispatchers []string
	// Credentials, when set, replace CredentialsFromEnv().
	Credentials *Credentials
	// SessionTTL is the session ttl asked for (default 10 s; the dispatcher bounds it).
	SessionTTL time.Duration
	// Namespace restricts the controller to one namespace; empty: all.
	Namespace string
	// LabelSelector and FieldSelector restrict the objects reconciled (Kubernetes syntax).
	LabelSelector, FieldSelector string
	// OwnedLabelSelector restricts the children of every Owns kind to those matching it, as a
	// cache's label selector for those kinds (cache.Options ByObject or DefaultLabelSelector)
	// would: the dispatchers watch only them, and Children lists only them. A child that loses
	// the label is as one deleted. Empty: every child.
	OwnedLabelSelector string
	// Payload is how much of the object a request carries (default PayloadFull).
	Payload PayloadMode
	// Prefetch is the most deliveries a poll asks for beyond the free workers, asked for only
	// while the replica's reconciles are quick (every one of the last twice
	// MaxConcurrentReconciles held its worker for at most an eighth of the reconcile limit
	// divided by the sessions polling; a delivery whose deadline passed counts as slow). They
	// wait in the queue for a worker, their deadline running, so that a worker that frees has
	// work at once instead of after a round trip to the dispatcher; a stop hands them back.
	// 0 (the zero value): MaxConcurrentReconciles; negative: none. Above the workers, a
	// delivery may wait longer than the quarter of its limit the default keeps it within.
	Prefetch int
	// TracerProvider starts each reconcile's span (default: OpenTelemetry's global provider,
	// which records nothing until the program sets one).
	TracerProvider trace.TracerProvider
}

// tracerName names the SDK's tracer (its instrumentation scope).
const tracerName = "github.com/kube-dispatch/kube-dispatch/controller-sdk/go/dispatch"

// Builder builds a controller whose reconcile requests come from the kube-dispatch tier, in
// the shape of controller-runtime's builder: For, Owns, Named, WithOptions and Complete take
// what controller-runtime's take, and Complete takes an unchanged reconcile.Reconciler. It
// registers no informer and needs no leader election: the dispatchers watch the resources,
// share the objects among the replicas of the group, and deliver each key to one replica at
// a time. The controller is controller-runtime's own (its workers, its metrics, its logs) with
// a work queue fed by the dispatchers and acknowledged as each reconcile returns.
type Builder struct {
	mgr         manager.Manager
	forObject   client.Object
	owns        []client.Object
	references  []reference
	name        string
	ctrlOptions controller.Options
	options     Options
	errs        []error
	// watched are the objects given to Watches without NamedAt: Build serves each that a
	// References names, and refuses the others.
	watched []watched
	// changesOf is what the predicates of For and WithEventFilter let through.
	changesOf parts
	// eventFilters counts WithEventFilter's predicates, refused in Build beside Owns or
	// References (controller-runtime applies them to every watch).
	eventFilters int
	// requests and everything are what ReconcileOn and ReconcileAllOn were given.
	requests   <-chan reconcile.Request
	everything <-chan struct{}
}

type watched struct {
	call   string
	object client.Object
}

type reference struct {
	object     client.Object
	fieldPaths []string
}

// ControllerManagedBy starts a controller for mgr, as builder.ControllerManagedBy does.
func ControllerManagedBy(mgr manager.Manager) *Builder {
	return &Builder{mgr: mgr}
}

// For names the kind reconciled. Of its options, builder.OnlyMetadata is served (there is no
// cache to keep whole objects in: a reconcile reads what it needs through the client), and so
// are builder.WithPredicates of predicate.GenerationChangedPredicate, LabelChangedPredicate,
// AnnotationChangedPredicate and ResourceVersionChangedPredicate, and predicate.Or and And of
// them: the dispatchers then deliver a change only when a part they compare changed, for every
// replica (creations, deletions, resyncs, retries and changes of children are always
// delivered). Any other predicate or option makes Build fail with what to do instead, rather
// than being ignored.
func (b *Builder) For(object client.Object, opts ...builder.ForOption) *Builder {
	if b.forObject != nil {
		b.errs = append(b.errs, errors.New("For() can only be called once"))
	}
	b.forObject = object
	// As in controller-runtime, a later WithPredicates replaces an earlier one.
	var predicates builder.ForOption
	for _, opt := range opts {
		switch opt.(type) {
		case builder.Predicates, *builder.Predicates:
			predicates = opt
		default:
			b.refuse(optionError("For", object, opt))
		}
	}
	if predicates != nil {
		p, err := predicateParts(predicates)
		if err != nil {
			b.refuse(fmt.Errorf("For(%T, builder.WithPredicates(...)): %w", object, err))
			return b
		}
		b.filter(fmt.Sprintf("For(%T, builder.WithPredicates(...))", object), p)
	}
	return b
}

// filter narrows the changes of the For kind delivered to those that pass p as well.
func (b *Builder) filter(call string, p parts) {
	both, ok := b.changesOf.and(p)
	if !ok {
		b.refuse(fmt.Errorf("%s: with the other predicates given, a change would have to change the generation and the labels at once, which the dispatchers cannot apply: combine them with predicate.Or", call))
		return
	}
	b.changesOf = both
}

// Owns reconciles the controlling owner (of the For kind) of each object of this kind that
// changes, and lists the children the dispatcher knows in each request (Children).
//
// Of its options, builder.OnlyMetadata is served (children are delivered as keys, never
// cached); predicates and builder.MatchEveryOwner make Build fail with what to do instead.
func (b *Builder) Owns(object client.Object, opts ...builder.OwnsOption) *Builder {
	b.owns = append(b.owns, object)
	for _, opt := range opts {
		b.refuse(optionError("Owns", object, opt))
	}
	return b
}

// refuse records err, if any, for Build to return.
func (b *Builder) refuse(err error) {
	if err != nil {
		b.errs = append(b.errs, err)
	}
}

// References reconciles each object of the For kind that names, at one of fieldPaths (for
// example "spec.secretName" or "spec.template.spec.volumes[*].secret.secretName"), an object
// of this kind in its namespace, when that object changes: controller-runtime's Watches with a
// field index and a map function, evaluated by the dispatchers.
func (b *Builder) References(object client.Object, fieldPaths ...string) *Builder {
	b.references = append(b.references, reference{object: object, fieldPaths: fieldPaths})
	return b
}

// ReconcileOn asks the tier to reconcile each object of the For kind that requests names, when
// the controller learns of a reason the tier cannot see (an external system changed): the
// request goes to the dispatcher serving the key, under the same exclusivity and coalescing as
// any change, as controller-runtime's source.Channel would feed the controller. Every replica
// of the group should send the same requests (each dispatcher is asked by the replicas
// connected to it). Keys wait, at most 1000, while no session is open.
func (b *Builder) ReconcileOn(requests <-chan reconcile.Request) *Builder {
	b.requests = requests
	return b
}

// ReconcileAllOn asks the tier to reconcile every object of the controller on each signal.
func (b *Builder) ReconcileAllOn(signals <-chan struct{}) *Builder {
	b.everything = signals
	return b
}

// Named sets the controller's name (default: the For kind in lower case).
func (b *Builder) Named(name string) *Builder {
	b.name = name
	return b
}

// WithOptions sets controller-runtime's options: MaxConcurrentReconciles is the number of
// reconciles this replica runs at once. RateLimiter, NewQueue, UsePriorityQueue and
// NeedLeaderElection are the tier's (the dispatchers own retries, backoff, ordering and
// exclusivity): setting one makes Build fail with what to do instead.
func (b *Builder) WithOptions(options controller.Options) *Builder {
	b.ctrlOptions = options
	if options.RateLimiter != nil {
		b.refuse(errors.New("WithOptions: RateLimiter is the dispatchers' (they back off a failing key, by their --backoff-* flags): remove it"))
	}
	if options.NewQueue != nil {
		b.refuse(errors.New("WithOptions: NewQueue is the SDK's (its queue is fed by the dispatchers): remove it"))
	}
	if options.UsePriorityQueue != nil && *options.UsePriorityQueue {
		b.refuse(errors.New("WithOptions: UsePriorityQueue: the dispatchers decide what is delivered when (the SDK's queue is fed by them): remove it"))
	}
	if options.NeedLeaderElection != nil && *options.NeedLeaderElection {
		b.refuse(errors.New("WithOptions: NeedLeaderElection: every replica reconciles on the tier, which hands each key to one of them at a time: remove it (and the manager's LeaderElection)"))
	}
	return b
}

// WithDispatchOptions sets how the controller reaches the tier.
func (b *Builder) WithDispatchOptions(options Options) *Builder {
	b.options = options
	return b
}

// Complete builds the controller and adds it, and the sessions that feed it, to the manager.
func (b *Builder) Complete(r reconcile.Reconciler) error {
	_, err := b.Build(r)
	return err
}

// Build is Complete, returning the controller.
func (b *Builder) Build(r reconcile.Reconciler) (controller.Controller, error) {
	if b.eventFilters > 0 && (len(b.owns) > 0 || len(b.references) > 0) {
		b.refuse(errors.New("WithEventFilter: controller-runtime applies it to Owns and Watches too, and the tier tells an owner of every change of its children (a naming object of every change of what it names): give the predicate to For instead (For(obj, builder.WithPredicates(...)))"))
	}
	if err := errors.Join(append(b.errs, b.unreferenced())...); err != nil {
		return nil, err
	}
	if r == nil {
		return nil, errors.New("must provide a non-nil Reconciler")
	}
	if b.forObject == nil {
		return nil, errors.New("For() must be called: the tier delivers the objects of one kind")
	}
	if b.ctrlOptions.Reconciler != nil {
		return nil, errors.New("reconciler was set via WithOptions() and via Build() or Complete()")
	}
	narrowed, err := b.cacheScoped()
	if err != nil {
		return nil, err
	}
	primary, gvk, err := b.resource(b.forObject)
	if err != nil {
		return nil, err
	}
	name := b.name
	if name == "" {
		name = strings.ToLower(gvk.Kind)
	}
	o, credentials, err := narrowed.withDefaults(name)
	if err != nil {
		return nil, err
	}
	subscriptions, err := b.subscriptions(primary, o)
	if err != nil {
		return nil, err
	}

	options := b.ctrlOptions
	if options.MaxConcurrentReconciles <= 0 {
		options.MaxConcurrentReconciles = 1
	}
	metrics := engine.NewMetrics(o.Group, name)
	q := newQueue(options.MaxConcurrentReconciles, o.Prefetch, metrics)
	tracers := o.TracerProvider
	if tracers == nil {
		tracers = otel.GetTracerProvider()
	}
	options.Reconciler = &reconciler{inner: r, queue: q, tracer: tracers.Tracer(tracerName)}
	options.NewQueue = func(string, workqueue.TypedRateLimiter[reconcile.Request]) workqueue.TypedRateLimitingInterface[reconcile.Request] {
		return q
	}
	noElection := false
	options.NeedLeaderElection = &noElection
	ctrl, err := controller.New(name, b.mgr, options)
	if err != nil {
		return nil, err
	}
	log := b.mgr.GetLogger().WithValues("controller", name, "group", o.Group)
	run := &runner{
		Sessions: &engine.Sessions{
			Log: log,
			Open: &pb.OpenSessionRequest{
				Group:         o.Group,
				ReplicaId:     o.ReplicaID,
				Subscriptions: subscriptions,
				Ttl:           durationpb.New(o.SessionTTL),
				Client:        clientName,
				Capabilities:  engine.Capabilities,
			},
			Dial:     credentials.dial,
			Queue:    q,
			Endings:  engine.NewEndings(log),
			Metrics:  metrics,
			Triggers: engine.NewTriggers(engine.RequestKey(gvk.Group, gvk.Kind)),
		},
		credentials:  credentials,
		loadBalancer: o.LoadBalancer,
		dispatchers:  o.Dispatchers,
		// Looked up while no load balancer answers.
		dispatcherService: o.DispatcherService,
		resolver:          o.ResolveDispatchers,
		requests:          b.requests,
		everything:        b.everything,
		// Counted in SessionsReady from now on: a manager already running starts the runner
		// at once.
		untrack: trackReadiness(metrics),
		elected: b.mgr.Elected(),
	}
	if _, ok := b.mgr.GetCache().(*indexCache); !ok {
		log.Info("the manager's cache is controller-runtime's: an IndexField on it, or a read through it, starts an informer that caches a whole kind; make the manager with ctrl.Options{NewCache: dispatch.NewCache}")
	}
	if err := engine.WorkqueueMetricsError(); err != nil {
		run.Log.Info("controller-runtime's workqueue metrics describe themselves otherwise in this release: the SDK's queue cannot record them", "error", err.Error())
	}
	if err := b.mgr.Add(run); err != nil {
		run.untrack()
		return nil, err
	}
	return ctrl, nil
}

// cacheScoped is the builder's options with what the manager's cache options narrow (when
// its cache is NewCache's).
func (b *Builder) cacheScoped() (Options, error) {
	c, ok := b.mgr.GetCache().(*indexCache)
	if !ok {
		return b.options, nil
	}
	forKind, err := apiutil.GVKForObject(b.forObject, b.mgr.GetScheme())
	if err != nil {
		return b.options, err
	}
	c.unapplied.Do(func() {
		for _, option := range c.scope.unapplied {
			b.mgr.GetLogger().Info("a cache option has nothing to apply to on the tier, which keeps no informer: it is not applied", "option", option)
		}
	})
	owned := make([]schema.GroupVersionKind, 0, len(b.owns))
	for _, object := range b.owns {
		kind, err := apiutil.GVKForObject(object, b.mgr.GetScheme())
		if err != nil {
			return b.options, err
		}
		owned = append(owned, kind)
	}
	return c.scope.narrow(b.options, forKind, owned)
}

// newQueue is the work queue of a controller of workers reconciles at once, asking ahead by
// prefetch (Options.Prefetch: 0 for the default, negative for none).
func newQueue(workers, prefetch int, metrics *engine.Metrics) *engine.Queue {
	q := engine.NewQueue(workers, metrics)
	if prefetch != 0 {
		q.Prefetch(max(prefetch, 0))
	}
	return q
}

// withDefaults is o with what it leaves unset filled in: the group named after the
// controller, the replica ID, the load balancer from KD_LOADBALANCER, the session TTL; and the
// credentials it gives, else those the environment says. An error for a dispatcher Service
// that is not host:port.
func (o Options) withDefaults(name string) (Options, Credentials, error) {
	if o.Group == "" {
		o.Group = name
	}
	if o.ReplicaID == "" {
		o.ReplicaID = defaultReplicaID()
	}
	credentials := CredentialsFromEnv()
	if o.Credentials != nil {
		credentials = *o.Credentials
	}
	if o.LoadBalancer == "" {
		o.LoadBalancer = os.Getenv("KD_LOADBALANCER")
	}
	if o.LoadBalancer == "" {
		o.LoadBalancer = DefaultLoadBalancer
	}
	if o.DispatcherService == "" {
		o.DispatcherService = strings.TrimSpace(os.Getenv("KD_DISPATCHER_SERVICE"))
	}
	if o.DispatcherService != "" {
		if _, _, err := net.SplitHostPort(o.DispatcherService); err != nil {
			return o, credentials, fmt.Errorf("the dispatcher Service %q (Options.DispatcherService, KD_DISPATCHER_SERVICE) must be host:port: %w", o.DispatcherService, err)
		}
	}
	if o.SessionTTL == 0 {
		o.SessionTTL = engine.DefaultTTL
	}
	return o, credentials, nil
}

// subscriptions is what the controller's session subscribes to: the primary kind (with its
// payload), each owned kind (keys of the owners), and each kind whose objects name a primary.
func (b *Builder) subscriptions(primary *pb.ResourceRef, o Options) ([]*pb.Subscription, error) {
	payload := pb.PayloadMode_PAYLOAD_MODE_FULL
	if o.Payload == PayloadKeyOnly {
		payload = pb.PayloadMode_PAYLOAD_MODE_KEY_ONLY
	}
	subscriptions := []*pb.Subscription{{
		Resource:      primary,
		Namespace:     o.Namespace,
		LabelSelector: o.LabelSelector,
		FieldSelector: o.FieldSelector,
		Payload:       payload,
		OnlyChangesOf: b.changesOf.wire(),
	}}
	for _, owned := range b.owns {
		ref, _, err := b.resource(owned)
		if err != nil {
			return nil, err
		}
		subscriptions = append(subscriptions, &pb.Subscription{
			Resource:      ref,
			Namespace:     o.Namespace,
			LabelSelector: o.OwnedLabelSelector,
			Payload:       pb.PayloadMode_PAYLOAD_MODE_KEY_ONLY,
			Owner:         primary,
		})
	}
	for _, named := range b.references {
		ref, _, err := b.resource(named.object)
		if err != nil {
			return nil, err
		}
		subscriptions = append(subscriptions, &pb.Subscription{
			Resource:     ref,
			Namespace:    o.Namespace,
			Payload:      pb.PayloadMode_PAYLOAD_MODE_KEY_ONLY,
			ReferencedBy: &pb.References{Resource: primary, FieldPaths: named.fieldPaths},
		})
	}
	return subscriptions, nil
}

// resource is the wire name of object's kind, from the manager's scheme and REST mapper.
func (b *Builder) resource(object client.Object) (*pb.ResourceRef, schema.GroupVersionKind, error) {
	gvk, err := apiutil.GVKForObject(object, b.mgr.GetScheme())
	if err != nil {
		return nil, gvk, err
	}
	mapping, err := b.mgr.GetRESTMapper().RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return nil, gvk, fmt.Errorf("cannot map %s to its resource: %w", gvk, err)
	}
	return &pb.ResourceRef{
		Group:   gvk.Group,
		Version: gvk.Version,
		Kind:    gvk.Kind,
		Plural:  mapping.Resource.Resource,
	}, gvk, nil
}

// defaultReplicaID is POD_NAME, else the host name and the process id.
func defaultReplicaID() string {
	if pod := os.Getenv("POD_NAME"); pod != "" {
		return pod
	}
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "replica"
	}
	return fmt.Sprintf("%s-%d", host, os.Getpid())
}
