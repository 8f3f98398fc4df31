package dispatch

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"

	"k8s.io/apimachinery/pkg/fields"
	klabels "k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
)

// The manager's cache options (ctrl.Options.Cache) say which objects a controller on an
// informer cache sees: a namespace (the WATCH_NAMESPACE of many operators), label and field
// selectors, for every kind or by kind. NewCache keeps them, and Build serves them as the
// controller's session options (the namespace and selectors the dispatchers watch with), as
// WithDispatchOptions would: a port keeps its manager's options unchanged. What the tier
// cannot serve makes NewCache or Build fail with what to do instead; what only shaped the
// informers' memory (transforms, deep copies, bookmarks, the informers themselves) has nothing
// to apply to and is logged once.

// cacheScope is what NewCache was told to narrow.
type cacheScope struct {
	// namespace is the one namespace of DefaultNamespaces (empty: every namespace), and
	// config what DefaultNamespaces says of it.
	namespace string
	config    cache.Config
	// label and field are the Default selectors, for every kind (nil: none).
	label klabels.Selector
	field fields.Selector
	// byKind are ByObject's, by kind.
	byKind map[schema.GroupVersionKind]cache.ByObject
	// unapplied names the options set that have nothing to apply to.
	unapplied []string
	// served are the kinds a Build narrowed (For and Owns), so that the cache's Start can name
	// the kinds of ByObject no controller's session narrows.
	served sync.Map
}

// newCacheScope is what options narrow, or why the tier cannot narrow it so; scheme names the
// kinds of ByObject (the manager's, which options.Scheme is unless the cache was made alone).
func newCacheScope(options cache.Options, scheme *runtime.Scheme) (*cacheScope, error) {
	s := &cacheScope{byKind: map[schema.GroupVersionKind]cache.ByObject{}}
	namespace, config, err := oneNamespace("cache.Options.DefaultNamespaces", options.DefaultNamespaces)
	if err != nil {
		return s, err
	}
	s.namespace, s.config = namespace, config
	s.label, s.field = options.DefaultLabelSelector, options.DefaultFieldSelector
	unapplied := map[string]bool{
		"SyncPeriod (the dispatchers resync every key at their --resync-interval)": options.SyncPeriod != nil || config.SyncPeriod != nil,
		"DefaultTransform": options.DefaultTransform != nil || config.Transform != nil,
		"DefaultUnsafeDisableDeepCopy (no object is cached, so none is shared)": options.DefaultUnsafeDisableDeepCopy != nil,
		"ReaderFailOnMissingInformer":                                           options.ReaderFailOnMissingInformer,
		"NewInformer":                                                           options.NewInformer != nil,
		"DefaultWatchErrorHandler":                                              options.DefaultWatchErrorHandler != nil,
	}
	for object, by := range options.ByObject {
		gvk, err := apiutil.GVKForObject(object, scheme)
		if err != nil {
			return s, fmt.Errorf("kube-dispatch: cache.Options.ByObject: %w", err)
		}
		if _, _, err := oneNamespace(fmt.Sprintf("cache.Options.ByObject[%s].Namespaces", gvk.Kind), by.Namespaces); err != nil {
			return s, err
		}
		s.byKind[gvk] = by
		unapplied[fmt.Sprintf("ByObject[%s].SyncPeriod", gvk.Kind)] = by.SyncPeriod != nil
		unapplied[fmt.Sprintf("ByObject[%s].Transform", gvk.Kind)] = by.Transform != nil
	}
	for name, set := range unapplied {
		if set {
			s.unapplied = append(s.unapplied, name)
		}
	}
	slices.Sort(s.unapplied)
	return s, nil
}

// oneNamespace is the one namespace named (empty with its config when none, or only
// cache.AllNamespaces, is), or why more cannot be served.
func oneNamespace(what string, namespaces map[string]cache.Config) (string, cache.Config, error) {
	switch len(namespaces) {
	case 0:
		return "", cache.Config{}, nil
	case 1:
		for namespace, config := range namespaces {
			return namespace, config, nil
		}
	}
	names := slices.Sorted(maps.Keys(namespaces))
	return "", cache.Config{}, fmt.Errorf("kube-dispatch: %s names %d namespaces (%s): a controller on the tier reconciles one namespace or all of them; "+
		"run a manager per namespace (one Deployment each), or leave the namespaces out and skip the others in Reconcile", what, len(names), strings.Join(names, ", "))
}

// firstSet is the first of selectors that is set (not nil), as controller-runtime's cache
// defaults them: a kind given labels.Everything() is exempt from the default selector.
func firstSet[S interface{ String() string }](selectors ...S) (S, bool) {
	for _, s := range selectors {
		if any(s) != nil {
			return s, true
		}
	}
	var none S
	return none, false
}

// scoped is the namespace and the label and field selectors the cache options give a kind, as
// the API server takes them (empty: every object).
type scoped struct{ namespace, label, field string }

// of is what the cache options give kind: its ByObject namespace, else DefaultNamespaces'; the
// selectors of that namespace's Config, else its ByObject ones, else the Default ones (the
// order in which controller-runtime fills them in). A selector that selects nothing
// (labels.Nothing(), which has no form the API server takes) is refused.
func (s *cacheScope) of(kind schema.GroupVersionKind) (scoped, error) {
	by := s.byKind[kind]
	namespace, config := s.namespace, s.config
	if len(by.Namespaces) > 0 {
		namespace, config, _ = oneNamespace("", by.Namespaces)
	}
	out := scoped{namespace: namespace}
	if label, ok := firstSet(config.LabelSelector, by.Label, s.label); ok {
		if !label.Empty() && label.String() == "" {
			return out, fmt.Errorf("kube-dispatch: the manager's cache options give %s a label selector that selects nothing: the dispatchers cannot watch nothing; remove the kind from the controller instead", kind.Kind)
		}
		out.label = label.String()
	}
	if field, ok := firstSet(config.FieldSelector, by.Field, s.field); ok {
		out.field = field.String()
	}
	return out, nil
}

// narrow is o with what the cache options said for a controller of forKind that owns owned:
// the namespace and the For kind's selectors where o leaves them unset, the owned kinds' label
// selector as OwnedLabelSelector. It fails where the two disagree, or where the tier has no
// way to narrow as the cache did.
func (s *cacheScope) narrow(o Options, forKind schema.GroupVersionKind, owned []schema.GroupVersionKind) (Options, error) {
	var errs []error
	set := func(what string, into *string, value string) {
		switch {
		case value == "" || *into == value:
		case *into == "":
			*into = value
		default:
			errs = append(errs, fmt.Errorf("kube-dispatch: WithDispatchOptions %s %q and the manager's cache options %q disagree: keep one", what, *into, value))
		}
	}
	s.served.Store(forKind, true)
	primary, err := s.of(forKind)
	if err != nil {
		return o, err
	}
	set("Namespace", &o.Namespace, primary.namespace)
	set("LabelSelector", &o.LabelSelector, primary.label)
	set("FieldSelector", &o.FieldSelector, primary.field)
	children := map[string][]string{}
	for _, kind := range owned {
		s.served.Store(kind, true)
		child, err := s.of(kind)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		// Children live in their owner's namespace: a kind cached in every namespace is
		// watched in the controller's, which is all the owners can own.
		if child.namespace != "" && child.namespace != o.Namespace {
			errs = append(errs, fmt.Errorf("kube-dispatch: the manager's cache options keep %s to namespace %q and the controller to %q: the tier watches a controller's children in its own namespace; give both one namespace", kind.Kind, child.namespace, o.Namespace))
		}
		if child.field != "" {
			errs = append(errs, fmt.Errorf("kube-dispatch: the manager's cache options give %s the field selector %q: the dispatchers narrow a controller's children by label only; "+
				"give %s a label selector (ByObject Label) instead, or skip the others in Reconcile", kind.Kind, child.field, kind.Kind))
		}
		children[child.label] = append(children[child.label], kind.Kind)
	}
	if len(children) > 1 {
		errs = append(errs, fmt.Errorf("kube-dispatch: the manager's cache options give the kinds %s owns different label selectors (%v): the dispatchers narrow every owned kind by one (OwnedLabelSelector); give them one", forKind.Kind, children))
	}
	for label := range children {
		set("OwnedLabelSelector", &o.OwnedLabelSelector, label)
	}
	return o, errors.Join(errs...)
}

// unserved names the kinds of ByObject that no Build narrowed: read only through the client,
// from the API server, which does not apply their selectors.
func (s *cacheScope) unserved() []string {
	var kinds []string
	for kind := range s.byKind {
		if _, ok := s.served.Load(kind); !ok {
			kinds = append(kinds, kind.Kind)
		}
	}
	slices.Sort(kinds)
	return kinds
}
