//! The dispatcher Lease: how a dispatcher announces itself, where it serves and which ring it
//! has released. The load balancer and every dispatcher read these Leases, so their label,
//! annotations and ring ids are part of the contract, specified in
//! `proto/kubedispatch/v1/leases.md`.

use std::collections::{BTreeMap, BTreeSet};

use sha2::{Digest, Sha256};

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

/// Annotation on a dispatcher's Lease (value `true`): its holder is joining the ring and is not
/// a member yet. It has made the controller groups its peers serve and is listing what it will
/// own; the other dispatchers keep serving those keys meanwhile, and count it a member once the
/// mark is gone (make before break: a join never makes a write wait for the joiner's list). The
/// load balancer places replicas on it all the same: their sessions are what make its groups.
pub const WARMING_ANNOTATION: &str = "kube-dispatch.dev/warming";

/// Annotation on a dispatcher's Lease: what it places keys by ([`RingKey::as_str`]).
pub const RING_KEY_ANNOTATION: &str = "kube-dispatch.dev/ring-key";

/// Annotation on a dispatcher's Lease: the [`session_tag`]s of every session its holder may
/// have handed keys to that may still be running them, as 16 lowercase hex digits each,
/// sorted and separated by `,` (empty: none); or [`SESSIONS_OVERFLOW`] when there are more than
/// it lists. A holder hands keys to a session only after a write that lists it was accepted, so
/// when it dies the others know every session whose reconciles they must see end before they
/// hand its keys to anyone else: once each is reported ended ([`ENDED_ANNOTATION`]), they need
/// not wait out the handover bound. Absent (a dispatcher older than this) or
/// [`SESSIONS_OVERFLOW`], they wait it out.
pub const SESSIONS_ANNOTATION: &str = "kube-dispatch.dev/sessions";

/// The value of [`SESSIONS_ANNOTATION`] when the holder has more sessions than it lists.
pub const SESSIONS_OVERFLOW: &str = "overflow";

/// Annotation on a dispatcher's Lease: the sessions of members that died which controller
/// replicas reported to its holder as ended (cancelled, every reconcile returned, never to run
/// again), as `<member>/<session tag>` entries separated by `,`. Any live member's Lease may
/// carry a report: a replica tells one dispatcher, and the Lease carries it to the others.
pub const ENDED_ANNOTATION: &str = "kube-dispatch.dev/ended-sessions";

/// Annotation on a dispatcher's Lease: the tier capabilities its holder has
/// ([`crate::capabilities::tier`]), separated by `,`. Absent: a dispatcher of release 0.1.0,
/// which has none. Readers take at most [`MOST_CAPABILITIES`] names of at most 63 bytes each,
/// and skip any other.
pub const CAPABILITIES_ANNOTATION: &str = "kube-dispatch.dev/capabilities";

/// Most capabilities a reader takes from one Lease.
pub const MOST_CAPABILITIES: usize = 64;

/// The value of [`CAPABILITIES_ANNOTATION`] listing `capabilities`.
pub fn capabilities_value(capabilities: &[&str]) -> String {
    capabilities.join(",")
}

/// The capabilities a [`CAPABILITIES_ANNOTATION`] value lists: names of lowercase letters,
/// digits and `-`, at most 63 bytes each, at most [`MOST_CAPABILITIES`] of them; anything
/// else is skipped, so a malformed list grants nothing it does not spell out.
pub fn parse_capabilities(value: &str) -> BTreeSet<String> {
    value
        .split(',')
        .map(str::trim)
        .filter(|name| {
            !name.is_empty()
                && name.len() <= 63
                && name
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        })
        .take(MOST_CAPABILITIES)
        .map(str::to_owned)
        .collect()
}

/// The tag that stands for a session in the Leases: the first 8 bytes of the SHA-256 of its id,
/// big-endian. Only the replica that holds a session knows its id, so a report naming the id
/// proves it came from there; the tag gives the id away to no reader of the Leases.
pub fn session_tag(session_id: &str) -> u64 {
    let digest = Sha256::digest(session_id.as_bytes());
    let mut bytes = [0u8; 8];
    bytes.copy_from_slice(&digest[..8]);
    u64::from_be_bytes(bytes)
}

/// The value of [`SESSIONS_ANNOTATION`] listing `tags`, or [`SESSIONS_OVERFLOW`].
pub fn sessions_value<'a>(tags: impl IntoIterator<Item = &'a u64>, overflow: bool) -> String {
    if overflow {
        return SESSIONS_OVERFLOW.to_owned();
    }
    let mut out = String::new();
    for tag in tags {
        if !out.is_empty() {
            out.push(',');
        }
        out.push_str(&format!("{tag:016x}"));
    }
    out
}

/// The tags a [`SESSIONS_ANNOTATION`] value lists; `None` for [`SESSIONS_OVERFLOW`] or a value
/// that does not parse (the sessions are then unknown).
pub fn parse_sessions(value: &str) -> Option<BTreeSet<u64>> {
    if value.is_empty() {
        return Some(BTreeSet::new());
    }
    value.split(',').map(parse_tag).collect()
}

/// The value of [`ENDED_ANNOTATION`] for the sessions reported ended, per member.
pub fn ended_value(ended: &BTreeMap<String, BTreeSet<u64>>) -> String {
    let mut out = String::new();
    for (member, tags) in ended {
        for tag in tags {
            if !out.is_empty() {
                out.push(',');
            }
            out.push_str(&format!("{member}/{tag:016x}"));
        }
    }
    out
}

/// The sessions an [`ENDED_ANNOTATION`] value reports ended, per member; entries that do not
/// parse are skipped (they only make the readers wait the bound).
pub fn parse_ended(value: &str) -> BTreeMap<String, BTreeSet<u64>> {
    let mut ended: BTreeMap<String, BTreeSet<u64>> = BTreeMap::new();
    for entry in value.split(',') {
        if let Some((member, tag)) = entry.rsplit_once('/')
            && !member.is_empty()
            && let Some(tag) = parse_tag(tag)
        {
            ended.entry(member.to_owned()).or_default().insert(tag);
        }
    }
    ended
}

fn parse_tag(text: &str) -> Option<u64> {
    (text.len() == 16)
        .then(|| u64::from_str_radix(text, 16).ok())
        .flatten()
}

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

    #[test]
    fn sessions_and_ended_reports_read_back_as_written() {
        let a = session_tag("group/replica-0/1");
        let b = session_tag("group/replica-1/2");
        assert_ne!(a, b);
        let tags = BTreeSet::from([a, b]);
        let value = sessions_value(&tags, false);
        assert_eq!(
            value.len(),
            33,
            "two tags of 16 hex digits and a comma: {value}"
        );
        assert_eq!(parse_sessions(&value), Some(tags.clone()));
        assert_eq!(parse_sessions(""), Some(BTreeSet::new()), "no session");
        assert_eq!(sessions_value(&tags, true), SESSIONS_OVERFLOW);
        assert_eq!(
            parse_sessions(SESSIONS_OVERFLOW),
            None,
            "unknown: wait the bound"
        );
        assert_eq!(parse_sessions("abc"), None, "malformed: unknown");

        let ended = BTreeMap::from([
            ("dispatcher-1".to_owned(), tags.clone()),
            ("dispatcher-2".to_owned(), BTreeSet::from([a])),
        ]);
        let value = ended_value(&ended);
        assert_eq!(parse_ended(&value), ended);
        let mut junk = value.clone();
        junk.push_str(",nonsense,/0000000000000001,dispatcher-3/xyz");
        assert_eq!(
            parse_ended(&junk),
            ended,
            "entries that do not parse are skipped"
        );
        assert!(parse_ended("").is_empty());
    }

    #[test]
    fn a_session_tag_is_the_first_bytes_of_the_sha256_of_its_id() {
        // SHA-256("abc") begins ba7816bf8f01cfea.
        assert_eq!(session_tag("abc"), 0xba78_16bf_8f01_cfea);
    }

    #[test]
    fn capabilities_round_trip_and_a_malformed_list_grants_only_what_it_spells_out() {
        use crate::capabilities::tier;
        let value = capabilities_value(&tier::ALL);
        let parsed = parse_capabilities(&value);
        assert_eq!(parsed.len(), tier::ALL.len());
        assert!(tier::ALL.iter().all(|c| parsed.contains(*c)));
        assert!(parse_capabilities("").is_empty());
        assert_eq!(
            parse_capabilities("warming, Peer-Groups,peer groups,,x/y,session-reports"),
            BTreeSet::from(["warming".to_owned(), "session-reports".to_owned()])
        );
        let long = "a".repeat(64);
        assert!(parse_capabilities(&long).is_empty());
        let many: Vec<String> = (0..200).map(|i| format!("c{i}")).collect();
        assert_eq!(parse_capabilities(&many.join(",")).len(), MOST_CAPABILITIES);
    }
}
