package dispatch

import (
	"slices"
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	pb "github.com/kube-dispatch/kube-dispatch/controller-sdk/go/internal/wire/kubedispatch/v1"
)

// The predicates the dispatchers apply become the subscription's only_changes_of, as
// controller-runtime would let updates through: all of WithPredicates must pass, any of Or.
func TestPredicatesBecomeTheChangeFilter(t *testing.T) {
	const (
		g = pb.ObjectPart_OBJECT_PART_GENERATION
		l = pb.ObjectPart_OBJECT_PART_LABELS
		a = pb.ObjectPart_OBJECT_PART_ANNOTATIONS
	)
	cases := []struct {
		name string
		opt  builder.Predicates
		want []pb.ObjectPart
	}{
		{"none", builder.WithPredicates(), nil},
		{"generation", builder.WithPredicates(predicate.GenerationChangedPredicate{}), []pb.ObjectPart{g}},
		{"generic generation", builder.WithPredicates(predicate.TypedGenerationChangedPredicate[client.Object]{}), []pb.ObjectPart{g}},
		{"a pointer", builder.WithPredicates(&predicate.LabelChangedPredicate{}), []pb.ObjectPart{l}},
		{"generation or labels", builder.WithPredicates(predicate.Or[client.Object](predicate.GenerationChangedPredicate{}, predicate.LabelChangedPredicate{})), []pb.ObjectPart{g, l}},
		{"or with every change", builder.WithPredicates(predicate.Or[client.Object](predicate.AnnotationChangedPredicate{}, predicate.ResourceVersionChangedPredicate{})), nil},
		{"and with every change", builder.WithPredicates(predicate.ResourceVersionChangedPredicate{}, predicate.AnnotationChangedPredicate{}), []pb.ObjectPart{a}},
		{"generation, and generation or labels", builder.WithPredicates(predicate.GenerationChangedPredicate{}, predicate.Or[client.Object](predicate.GenerationChangedPredicate{}, predicate.LabelChangedPredicate{})), []pb.ObjectPart{g}},
		{"and of one part twice", builder.WithPredicates(predicate.And[client.Object](predicate.GenerationChangedPredicate{}, predicate.GenerationChangedPredicate{})), []pb.ObjectPart{g}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p, err := predicateParts(c.opt)
			if err != nil {
				t.Fatal(err)
			}
			if got := p.wire(); !slices.Equal(got, c.want) {
				t.Fatalf("only_changes_of %v, want %v", got, c.want)
			}
		})
	}
	// As in controller-runtime, the last WithPredicates of a For replaces the earlier ones.
	last := &Builder{}
	last.For(nil, builder.WithPredicates(predicate.GenerationChangedPredicate{}), builder.WithPredicates(predicate.ResourceVersionChangedPredicate{}))
	if len(last.errs) != 0 || last.changesOf.wire() != nil {
		t.Fatalf("errors %v, only_changes_of %v; want every change", last.errs, last.changesOf.wire())
	}
	// WithEventFilter and For's predicates must both pass.
	b := &Builder{}
	b.For(nil, builder.WithPredicates(predicate.Or[client.Object](predicate.GenerationChangedPredicate{}, predicate.LabelChangedPredicate{})))
	b.WithEventFilter(predicate.Or[client.Object](predicate.GenerationChangedPredicate{}, predicate.LabelChangedPredicate{}))
	if len(b.errs) != 0 || !slices.Equal(b.changesOf.wire(), []pb.ObjectPart{g, l}) {
		t.Fatalf("errors %v, only_changes_of %v", b.errs, b.changesOf.wire())
	}
}
