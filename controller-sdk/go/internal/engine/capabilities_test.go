package engine

import (
	"slices"
	"testing"

	pb "github.com/kube-dispatch/kube-dispatch/controller-sdk/go/internal/wire/kubedispatch/v1"
)

// A session is of use only with a dispatcher that serves what its subscriptions need.
func TestOwnerAndReferencedBySubscriptionsNeedTheirCapabilities(t *testing.T) {
	plain := &pb.Subscription{}
	owned := &pb.Subscription{Owner: &pb.ResourceRef{}}
	referenced := &pb.Subscription{ReferencedBy: &pb.References{}}
	if got := missingCapabilities([]*pb.Subscription{plain}, nil); got != nil {
		t.Fatalf("a plain subscription needs %v", got)
	}
	all := []*pb.Subscription{plain, owned, referenced, owned}
	if got := missingCapabilities(all, nil); !slices.Equal(got, []string{"children", "references"}) {
		t.Fatalf("missing from a dispatcher that lists none: %v", got)
	}
	if got := missingCapabilities(all, []string{"children"}); !slices.Equal(got, []string{"references"}) {
		t.Fatalf("missing from one that lists children: %v", got)
	}
	if got := missingCapabilities(all, Capabilities); got != nil {
		t.Fatalf("missing from one that lists all: %v", got)
	}
}
