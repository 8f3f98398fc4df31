package engine

import (
	"slices"

	pb "github.com/kube-dispatch/kube-dispatch/controller-sdk/go/internal/wire/kubedispatch/v1"
)

// The features of the wire API beyond its first form (proto/kubedispatch/v1/versions.md,
// "Capabilities"), as the Rust SDK names them (kube_dispatch_proto::capabilities).
const (
	// capabilityChildren: subscriptions with an owner, and the children listed in requests.
	capabilityChildren = "children"
	// capabilityReferences: subscriptions with referenced_by.
	capabilityReferences = "references"
	// capabilityTriggers: the Trigger call.
	capabilityTriggers = "triggers"
	// capabilityChangeFilters: Subscription.only_changes_of. Never needed: a dispatcher
	// without it delivers every change.
	capabilityChangeFilters = "change-filters"
	// capabilityChildrenBodies: OwnedObject.object_json, the bodies of an owner's children in
	// its requests, sent to sessions that list it. Never needed: without them a List of the
	// children reads them.
	capabilityChildrenBodies = "children-bodies"
)

// Capabilities are those this SDK understands.
var Capabilities = []string{capabilityChildren, capabilityReferences, capabilityTriggers, capabilityChangeFilters, capabilityChildrenBodies}

// missingCapabilities are those the subscriptions need that the dispatcher did not list: an
// older dispatcher would take an owner or referenced_by subscription, whose fields it does not
// know, for a plain one.
func missingCapabilities(subscriptions []*pb.Subscription, offered []string) []string {
	var needed []string
	for _, s := range subscriptions {
		if s.GetOwner() != nil && !slices.Contains(needed, capabilityChildren) {
			needed = append(needed, capabilityChildren)
		}
		if s.GetReferencedBy() != nil && !slices.Contains(needed, capabilityReferences) {
			needed = append(needed, capabilityReferences)
		}
	}
	var missing []string
	for _, n := range needed {
		if !slices.Contains(offered, n) {
			missing = append(missing, n)
		}
	}
	return missing
}
