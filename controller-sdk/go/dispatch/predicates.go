package dispatch

import (
	"fmt"
	"reflect"
	"strings"

	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	pb "github.com/kube-dispatch/kube-dispatch/controller-sdk/go/internal/wire/kubedispatch/v1"
)

// The predicates of For and WithEventFilter that the dispatchers apply: a change of an object
// of the For kind is delivered only when a part a predicate compares changed (the wire's
// Subscription.only_changes_of; keys.md, "Change filters"). Creations, deletions, resyncs,
// retries, requeues and changes of children and named objects are always delivered.

// parts is what a predicate lets through on an update: a change of any of its parts, or of
// anything (everyChange).
type parts uint8

const (
	everyChange parts = 0
	generation  parts = 1 << iota
	labels
	annotations
)

// or lets through what either lets through.
func (p parts) or(q parts) parts {
	if p == everyChange || q == everyChange {
		return everyChange
	}
	return p | q
}

// and lets through what both let through: a change of any of p's parts that is one of q's
// when p's parts are among q's; false where the dispatchers cannot say it (a change of the
// generation and of the labels at once).
func (p parts) and(q parts) (parts, bool) {
	switch {
	case p == everyChange:
		return q, true
	case q == everyChange:
		return p, true
	case p&q == q:
		return q, true
	case p&q == p:
		return p, true
	}
	return 0, false
}

// wire is the subscription's only_changes_of.
func (p parts) wire() []pb.ObjectPart {
	var out []pb.ObjectPart
	for _, part := range []struct {
		bit  parts
		wire pb.ObjectPart
	}{{generation, pb.ObjectPart_OBJECT_PART_GENERATION}, {labels, pb.ObjectPart_OBJECT_PART_LABELS}, {annotations, pb.ObjectPart_OBJECT_PART_ANNOTATIONS}} {
		if p&part.bit != 0 {
			out = append(out, part.wire)
		}
	}
	return out
}

var (
	predicatePackage = reflect.TypeFor[predicate.Funcs]().PkgPath()
	knownPredicates  = map[reflect.Type]parts{
		reflect.TypeFor[predicate.GenerationChangedPredicate]():      generation,
		reflect.TypeFor[predicate.LabelChangedPredicate]():           labels,
		reflect.TypeFor[predicate.AnnotationChangedPredicate]():      annotations,
		reflect.TypeFor[predicate.ResourceVersionChangedPredicate](): everyChange,
	}
)

// predicateParts is what the predicates of a builder.Predicates option (all of them must
// pass) let through.
func predicateParts(option any) (parts, error) {
	v := reflect.Indirect(reflect.ValueOf(option))
	if v.Kind() != reflect.Struct {
		return 0, errUnknownPredicate(v)
	}
	return conjunction(v.FieldByName("predicates"))
}

// eventFilterParts is what WithEventFilter's predicate lets through.
func eventFilterParts(p predicate.Predicate) (parts, error) {
	return predicateValueParts(reflect.ValueOf(p))
}

// conjunction is what a list of predicates that must all pass lets through.
func conjunction(list reflect.Value) (parts, error) {
	if list.Kind() != reflect.Slice {
		return 0, errUnknownPredicate(list)
	}
	all := everyChange
	for i := range list.Len() {
		p, err := predicateValueParts(list.Index(i))
		if err != nil {
			return 0, err
		}
		var ok bool
		if all, ok = all.and(p); !ok {
			return 0, fmt.Errorf("predicates that must all pass on different parts (a change of the generation and of the labels at once) cannot be applied by the dispatchers: use predicate.Or, or one of them")
		}
	}
	return all, nil
}

// predicateValueParts is what the predicate v holds lets through: one the dispatchers apply,
// or predicate.Or and predicate.And of them (read through reflection: their types are
// unexported; a controller-runtime that renames them makes them refused, never ignored).
func predicateValueParts(v reflect.Value) (parts, error) {
	for v.Kind() == reflect.Interface || v.Kind() == reflect.Pointer {
		if v.IsNil() {
			return 0, errUnknownPredicate(reflect.Value{})
		}
		v = v.Elem()
	}
	if !v.IsValid() {
		return 0, errUnknownPredicate(v)
	}
	if p, ok := knownPredicates[v.Type()]; ok {
		if hasFuncs(v) {
			return 0, fmt.Errorf("%s with functions of its own set (CreateFunc, UpdateFunc, DeleteFunc, GenericFunc) is not applied by the tier, which applies the predicate's own comparison only: remove the functions, or skip in Reconcile what they skipped", typeName(v))
		}
		return p, nil
	}
	if v.Kind() != reflect.Struct || v.Type().PkgPath() != predicatePackage {
		return 0, errUnknownPredicate(v)
	}
	switch name := v.Type().Name(); {
	case strings.HasPrefix(name, "and["):
		return conjunction(v.FieldByName("predicates"))
	case strings.HasPrefix(name, "or["):
		list := v.FieldByName("predicates")
		if list.Kind() != reflect.Slice || list.Len() == 0 {
			return 0, errUnknownPredicate(v)
		}
		var any parts
		for i := range list.Len() {
			p, err := predicateValueParts(list.Index(i))
			if err != nil {
				return 0, err
			}
			if i == 0 {
				any = p
			} else {
				any = any.or(p)
			}
		}
		return any, nil
	}
	return 0, errUnknownPredicate(v)
}

// hasFuncs says whether the known predicate v carries functions of its own in its embedded
// TypedFuncs (which controller-runtime calls for the events other than updates).
func hasFuncs(v reflect.Value) bool {
	for i := range v.NumField() {
		field := v.Field(i)
		if !v.Type().Field(i).Anonymous || field.Kind() != reflect.Struct {
			continue
		}
		for j := range field.NumField() {
			if f := field.Field(j); f.Kind() == reflect.Func && !f.IsNil() {
				return true
			}
		}
	}
	return false
}

// typeName names v's type as a program spells it: predicate.TypedFuncs[client.Object], not
// the package path in brackets.
func typeName(v reflect.Value) string {
	return strings.ReplaceAll(v.Type().String(), reflect.TypeFor[client.Object]().PkgPath()+".", "client.")
}

func errUnknownPredicate(v reflect.Value) error {
	kind := "a nil predicate"
	if v.IsValid() {
		kind = typeName(v)
	}
	return fmt.Errorf("%s is not applied by the tier, which delivers every change of the objects it serves (level-triggered); "+
		"the dispatchers apply predicate.GenerationChangedPredicate, LabelChangedPredicate, AnnotationChangedPredicate and ResourceVersionChangedPredicate, and predicate.Or of them; "+
		"for others, narrow what is delivered with Options.LabelSelector or FieldSelector, or skip in Reconcile what the predicate skipped", kind)
}
