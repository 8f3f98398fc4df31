//! The dispatcher Lease: how a dispatcher announces itself, where it serves and which ring it
//! has released. The load balancer and every dispatcher read these Leases, so their label,
//! annotations and ring ids are part of the contract, specified in
//! `proto/kubedispatch/v1/leases.md`.

use crate::{Ring, RingKey, key::hash64};

/// Label (value `true`) that marks a `coordination.k8s.io` Lease as a dispatcher's.
pub const LEASE_LABEL: &str = "kube-dispatch.dev/dispatcher";

/// Annotation on a dispatcher's Lease: the `host:port` its gRPC API is reached at.
pub const ADDRESS_ANNOTATION: &str = "kube-dispatch.dev/address";

/// Annotation on a dispatcher's Lease: the [`ring_id`] of the ring this dispatcher has
/// released, i.e. under which it hands out, and has in flight, only keys it owns.
pub const RELEASED_ANNOTATION: &str = "kube-dispatch.dev/released-ring";

/// Annotation on a dispatcher's Lease, beside [`RELEASED_ANNOTATION`]: the newest Lease
/// resourceVersion its holder had seen when it wrote the release. A release counts for a
/// dispatcher only if its holder had seen every Lease write that dispatcher had seen when it
/// adopted the ring: a holder whose watch lags may not know yet of a member that died, and
/// would release a ring it must not. Absent (older dispatchers), the release counts as before.
pub const RELEASED_AFTER_ANNOTATION: &str = "kube-dispatch.dev/released-after";

/// Annotation on a dispatcher's Lease, while its holder waits for the others' releases: the
/// [`ring_id`] of the ring it adopted, then `@`, then the newest Lease resourceVersion it had
/// seen when it adopted it (`<ring id>@<resourceVersion>`). A release counts for it only if
/// written after that, so a member that released the same ring earlier writes its Lease again
/// at once on seeing this, rather than on its next periodic renewal: a dispatcher that joins
/// is served its keys in about a Lease round trip instead of up to a renew period. Absent
/// (settled, or an older dispatcher), the others renew on their period as before.
pub const AWAITS_ANNOTATION: &str = "kube-dispatch.dev/awaits-release";

/// Annotation on a dispatcher's Lease (value `true`): its holder drained, nothing it handed out
/// runs any more, and it deletes the Lease next. Only a Lease deleted with this mark is a
/// release; one deleted without it is a member that died, whose reconciles are waited out.
pub const DRAINED_ANNOTATION: &str = "kube-dispatch.dev/drained";

/// Annotation on a dispatcher's Lease: what it places keys by ([`RingKey::as_str`]).
pub const RING_KEY_ANNOTATION: &str = "kube-dispatch.dev/ring-key";

/// The value of [`AWAITS_ANNOTATION`]: ring `id`, adopted when the newest Lease
/// resourceVersion seen was `seen`.
pub fn awaits_value(id: &str, seen: u128) -> String {
    format!("{id}@{seen}")
}

/// The ring id and resourceVersion an [`AWAITS_ANNOTATION`] value holds; `None` if malformed.
pub fn parse_awaits(value: &str) -> Option<(String, u128)> {
    let (id, seen) = value.split_once('@')?;
    (!id.is_empty()).then(|| Some((id.to_owned(), seen.parse().ok()?)))?
}

/// The id of a ring: XXH64 (seed 0) of its members, sorted and joined with `,`, as 16 lowercase
/// hex digits; on a ring keyed by namespace, of the same string after `namespace:`, so that
/// dispatchers placing keys differently never release the same ring.
pub fn ring_id(ring: &Ring) -> String {
    let members = ring.members().join(",");
    let text = match ring.key() {
        RingKey::Name => members,
        RingKey::Namespace => format!("namespace:{members}"),
    };
    format!("{:016x}", hash64(text.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ring_id_does_not_depend_on_the_order_members_are_given_in() {
        let a = Ring::new(["d1", "d0", "d2"]);
        let b = Ring::new(["d2", "d1", "d0"]);
        assert_eq!(ring_id(&a), ring_id(&b));
        assert_eq!(ring_id(&a).len(), 16);
        assert_ne!(ring_id(&a), ring_id(&Ring::new(["d0", "d1"])));
        assert_eq!(
            ring_id(&a),
            format!("{:016x}", hash64(b"d0,d1,d2")),
            "the members are sorted and joined with a comma"
        );
        let by_namespace = Ring::with_key(["d0", "d1", "d2"], RingKey::Namespace);
        assert_eq!(
            ring_id(&by_namespace),
            format!("{:016x}", hash64(b"namespace:d0,d1,d2"))
        );
    }
}
