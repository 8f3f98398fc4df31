package dispatch

import (
	"errors"
	"fmt"
	"slices"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"
)

// The calls and options of controller-runtime's builder that a port keeps: each is served on
// the tier, or makes Build fail with what to do instead (README, "Builder options").

// optionError says why the tier does not take option of call(object), and what to do instead;
// nil for an option it serves.
func optionError(call string, object client.Object, option any) error {
	switch option.(type) {
	case builder.Predicates, *builder.Predicates:
		return fmt.Errorf("%s(%T, builder.WithPredicates(...)): predicates are not applied here: the tier tells an owner of every change of its children, and a naming object of every change of what it names (level-triggered); "+
			"narrow what is delivered with Options.OwnedLabelSelector, or skip in Reconcile what the predicate skipped, then remove WithPredicates "+
			"(predicates on For are applied by the dispatchers: generation, label and annotation predicates)", call, object)
	}
	// Comparing interfaces of different dynamic types never panics: an option of another,
	// incomparable type just matches neither case.
	switch option {
	case any(builder.OnlyMetadata):
		return nil
	case any(builder.MatchEveryOwner):
		return fmt.Errorf("Owns(%T, builder.MatchEveryOwner): the tier reconciles the controlling owner of a changed child; "+
			"to reconcile every owner, use References with the field path that names them, or ReconcileOn", object)
	}
	return fmt.Errorf("%s(%T, %T): this option is not served by the tier: remove it", call, object, option)
}

// Watches is served when the builder says where the objects of the For kind name object: by
// References(object, field paths), or by NamedAt(field paths) among its options. The
// dispatchers then reconcile the objects that name it when it changes, and the handler (a map
// function that lists an index of those objects by that field, as a rule) is not called. Any
// other Watches makes Build fail: its handler maps the events of an informer of object's whole
// kind, which the tier does not run; the error says what serves the usual handlers (References
// for a map function over a field index, Owns for EnqueueRequestForOwner, ReconcileOn for
// requests from elsewhere).
//
//	dispatch.ControllerManagedBy(mgr).For(&v1.Mirror{}).
//		Watches(&corev1.ConfigMap{}, handler.EnqueueRequestsFromMapFunc(r.mirrorsOf)).
//		References(&corev1.ConfigMap{}, "spec.configMapName")
func (b *Builder) Watches(object client.Object, _ handler.EventHandler, opts ...builder.WatchesOption) *Builder {
	return b.watches("Watches", object, opts)
}

// WatchesMetadata is Watches.
func (b *Builder) WatchesMetadata(object client.Object, _ handler.EventHandler, opts ...builder.WatchesOption) *Builder {
	return b.watches("WatchesMetadata", object, opts)
}

func (b *Builder) watches(call string, object client.Object, opts []builder.WatchesOption) *Builder {
	var paths []string
	for _, option := range opts {
		switch option := option.(type) {
		case namedAt:
			paths = append(paths, option.fieldPaths...)
		default:
			b.refuse(optionError(call, object, option))
		}
	}
	if len(paths) == 0 {
		b.watched = append(b.watched, watched{call: call, object: object})
		return b
	}
	return b.References(object, paths...)
}

// unreferenced refuses each Watches whose kind no References names.
func (b *Builder) unreferenced() error {
	scheme := b.mgr.GetScheme()
	kindOf := func(object client.Object) schema.GroupKind {
		gvk, err := apiutil.GVKForObject(object, scheme)
		if err != nil {
			return schema.GroupKind{}
		}
		return gvk.GroupKind()
	}
	var errs []error
	for _, w := range b.watched {
		kind := kindOf(w.object)
		if kind.Empty() || !slices.ContainsFunc(b.references, func(r reference) bool { return kindOf(r.object) == kind }) {
			errs = append(errs, watchesError(w.call, w.object))
		}
	}
	return errors.Join(errs...)
}

// NamedAt is an option of Watches: the objects of the For kind name the watched object at
// these field paths (as References takes them), and the dispatchers reconcile those that name
// it when it changes.
func NamedAt(fieldPaths ...string) builder.WatchesOption {
	return namedAt{fieldPaths: fieldPaths}
}

// namedAt is NamedAt's option. Only Builder.Watches reads it; the embedded empty predicates
// give it controller-runtime's option type, doing nothing if controller-runtime's own builder
// is given it.
type namedAt struct {
	builder.Predicates
	fieldPaths []string
}

// WatchesRawSource is refused: a source of the controller's own feeds controller-runtime's
// queue, which the SDK's replaces; ReconcileOn takes a channel of requests.
func (b *Builder) WatchesRawSource(source.TypedSource[reconcile.Request]) *Builder {
	b.refuse(errors.New("WatchesRawSource: the SDK's queue is fed by the dispatchers, so a source of the controller's own would feed nothing; send its requests on a channel given to ReconcileOn"))
	return b
}

// WithEventFilter applies p as For's predicates are applied (see For), when the controller
// has neither Owns nor References: controller-runtime applies it to those watches too, and the
// tier tells an owner of every change of its children, so Build refuses it there (give it to
// For instead).
func (b *Builder) WithEventFilter(p predicate.Predicate) *Builder {
	b.eventFilters++
	parts, err := eventFilterParts(p)
	if err != nil {
		b.refuse(fmt.Errorf("WithEventFilter: %w", err))
		return b
	}
	b.filter("WithEventFilter", parts)
	return b
}

// watchesError says why call(object) is refused, and what serves it instead.
func watchesError(call string, object client.Object) error {
	return fmt.Errorf("%s(%T, ...): a handler maps the events of an informer of the whole kind, which the tier does not run; "+
		"for objects of the For kind that name it at a field path (a map function listing an index), add References(%T, \"spec.path\") or the option dispatch.NamedAt(\"spec.path\"); "+
		"for children, Owns; for requests from elsewhere, ReconcileOn", call, object, object)
}
