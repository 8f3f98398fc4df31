//! The consistent-hash ring that splits request keys among dispatchers.
//!
//! The placement rules are part of the wire contract (`proto/kubedispatch/v1/keys.md`): every
//! member has [`Ring::VIRTUAL_NODES`] points at `XXH64("<member>#<i>")`, and a key belongs to the
//! first point at or after its placement hash, wrapping around. The placement hash is the key's
//! own hash on a ring keyed by name ([`RingKey::Name`], the default), or FNV-1a 64 of its
//! namespace on a ring keyed by namespace ([`RingKey::Namespace`]), the hash the API server's
//! `shardSelector` filters on, so a dispatcher can ask it for its own ranges only
//! ([`Ring::shard_selector`]).

use std::{
    fmt::Write as _,
    hash::{Hash, Hasher},
};

use hashring::HashRing;
use nohash_hasher::BuildNoHashHasher;

use crate::key::{RequestKey, hash64};

/// A virtual node: a point on the ring and the index of the member that owns it.
#[derive(Clone, Copy, Debug)]
struct VirtualNode {
    point: u64,
    member: usize,
}

impl Hash for VirtualNode {
    // The ring hashes nodes with an identity hasher: the node's place is its precomputed point.
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.point);
    }
}

/// What places a key on the ring. Every dispatcher of a tier must use the same; the ring id
/// (`lease::ring_id`) differs between the two, so dispatchers that disagree never complete a
/// handover together.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum RingKey {
    /// The whole key, `XXH64("group/kind/namespace/name")`: keys spread evenly whatever the
    /// namespaces, and every dispatcher receives every event of its watches.
    #[default]
    Name,
    /// The namespace alone, FNV-1a 64 of its UTF-8 bytes (cluster-scoped keys: of the empty
    /// string): a namespace's keys stay on one dispatcher, which can ask the API server for its
    /// own namespaces only (`shardSelector` on `object.metadata.namespace`).
    Namespace,
}

impl RingKey {
    /// `name` or `namespace`, as the dispatcher's flag and Lease spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Name => "name",
            Self::Namespace => "namespace",
        }
    }
    /// The placement hash of a request key given as its wire string, `group/kind/namespace/name`.
    pub fn place(self, key: &str) -> u64 {
        match self {
            Self::Name => hash64(key.as_bytes()),
            Self::Namespace => namespace_hash(key.split('/').nth(2).unwrap_or_default()),
        }
    }

    /// The placement hash of a request key whose [`hash64`] is already known.
    pub fn place_hashed(self, key: &str, key_hash: u64) -> u64 {
        match self {
            Self::Name => key_hash,
            Self::Namespace => self.place(key),
        }
    }

    /// The placement hash of a request key.
    pub fn place_key(self, key: &RequestKey) -> u64 {
        match self {
            Self::Name => key.hash64(),
            Self::Namespace => namespace_hash(&key.namespace),
        }
    }
}

/// FNV-1a 64 of a namespace's UTF-8 bytes: the hash of `object.metadata.namespace` that the API
/// server's shard selector compares with its ranges.
pub fn namespace_hash(namespace: &str) -> u64 {
    let mut hasher = fnv::FnvHasher::default();
    hasher.write(namespace.as_bytes());
    hasher.finish()
}

/// An immutable ring over a set of members. Build a new one when membership changes, or
/// derive one with a member more or less ([`Ring::with_member`], [`Ring::without_member`]),
/// which computes only that member's points.
#[derive(Clone)]
pub struct Ring {
    members: Vec<String>,
    key: RingKey,
    /// Every member's points, collisions included, sorted by point, then member: what a
    /// member more or less is merged into or taken from (about 16 bytes a point).
    points: Vec<VirtualNode>,
    /// The points that place keys: the first of each point in `points`.
    ring: HashRing<VirtualNode, BuildNoHashHasher<u64>>,
}

impl std::fmt::Debug for Ring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ring")
            .field("members", &self.members)
            .field("key", &self.key)
            .finish()
    }
}

impl Ring {
    /// Virtual nodes per member.
    pub const VIRTUAL_NODES: u32 = 128;

    /// A ring keyed by name over `members`; order and duplicates do not matter.
    pub fn new<I, S>(members: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self::with_key(members, RingKey::Name)
    }

    /// A ring over `members` that places keys by `key`.
    pub fn with_key<I, S>(members: I, key: RingKey) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let mut members: Vec<String> = members.into_iter().map(Into::into).collect();
        members.sort();
        members.dedup();
        let mut points: Vec<VirtualNode> = members
            .iter()
            .enumerate()
            .flat_map(|(index, member)| Self::points_of(member, index))
            .collect();
        points.sort_unstable_by_key(|n| (n.point, n.member));
        Self::of_points(members, key, points)
    }

    /// This ring with `member` on it too (itself if it is already): only the new member's
    /// points are computed, and merged into the others'.
    #[must_use]
    pub fn with_member(self, member: &str) -> Self {
        let Err(at) = self.members.binary_search_by(|m| m.as_str().cmp(member)) else {
            return self;
        };
        let (mut members, key) = (self.members, self.key);
        members.insert(at, member.to_owned());
        let mut added = Self::points_of(member, at);
        added.sort_unstable_by_key(|n| n.point);
        let mut points = Vec::with_capacity(self.points.len() + added.len());
        let mut added = added.into_iter().peekable();
        for mut node in self.points {
            if node.member >= at {
                node.member += 1;
            }
            while let Some(new) =
                added.next_if(|new| (new.point, new.member) < (node.point, node.member))
            {
                points.push(new);
            }
            points.push(node);
        }
        points.extend(added);
        Self::of_points(members, key, points)
    }

    /// This ring without `member` (itself if it is not on it).
    #[must_use]
    pub fn without_member(self, member: &str) -> Self {
        let Ok(at) = self.members.binary_search_by(|m| m.as_str().cmp(member)) else {
            return self;
        };
        let (mut members, key) = (self.members, self.key);
        members.remove(at);
        let mut points = self.points;
        points.retain(|n| n.member != at);
        for node in &mut points {
            if node.member > at {
                node.member -= 1;
            }
        }
        Self::of_points(members, key, points)
    }

    /// The ring of sorted, distinct `members` whose points, collisions included, are `points`,
    /// sorted by point, then member.
    fn of_points(members: Vec<String>, key: RingKey, points: Vec<VirtualNode>) -> Self {
        let mut ring = HashRing::with_hasher(BuildNoHashHasher::default());
        // Sorted already, which the ring's sort finds in one pass.
        ring.batch_add(placing(&points));
        Self {
            members,
            key,
            points,
            ring,
        }
    }

    /// What places keys on this ring.
    pub fn key(&self) -> RingKey {
        self.key
    }

    /// The placement hash of a key given as its wire string.
    pub fn place(&self, key: &str) -> u64 {
        self.key.place(key)
    }

    /// The points of `member`, the `index`-th member: `XXH64("<member>#<i>")` for each virtual
    /// node, each name hashed from one reused buffer (rings are rebuilt whenever membership
    /// changes, a group's replicas as well as the dispatchers).
    fn points_of(member: &str, index: usize) -> Vec<VirtualNode> {
        let (mut name, mut digits) = (Vec::new(), itoa::Buffer::new());
        (0..Self::VIRTUAL_NODES)
            .map(|i| {
                name.clear();
                name.extend_from_slice(member.as_bytes());
                name.push(b'#');
                name.extend_from_slice(digits.format(i).as_bytes());
                VirtualNode {
                    point: hash64(&name),
                    member: index,
                }
            })
            .collect()
    }

    /// The points that place keys, sorted ([`placing`]).
    fn placing_points(&self) -> Vec<VirtualNode> {
        placing(&self.points)
    }

    /// The members, sorted.
    pub fn members(&self) -> &[String] {
        &self.members
    }

    /// Whether `member` is on the ring.
    pub fn contains(&self, member: &str) -> bool {
        self.members
            .binary_search_by(|m| m.as_str().cmp(member))
            .is_ok()
    }

    /// The member that owns a placement hash ([`Ring::place`]); `None` when the ring is empty.
    pub fn owner_of_hash(&self, placement: u64) -> Option<&str> {
        let node = self.ring.get(&placement)?;
        Some(self.members[node.member].as_str())
    }

    /// The member that owns a request key; `None` when the ring is empty.
    pub fn owner(&self, key: &RequestKey) -> Option<&str> {
        self.owner_of_hash(self.key.place_key(key))
    }

    /// The ranges of placement hashes `member` owns, sorted, adjacent ones merged: each from
    /// its start (inclusive) to its end (exclusive, up to 2^64). Empty for a member not on the
    /// ring.
    pub fn ranges(&self, member: &str) -> Vec<(u64, u128)> {
        let Ok(index) = self.members.binary_search_by(|m| m.as_str().cmp(member)) else {
            return Vec::new();
        };
        let points = self.placing_points();
        if points.iter().all(|n| n.member == index) {
            return vec![(0, 1 << 64)];
        }
        // A point owns the hashes after the point before it, up to and including itself.
        let mut ranges: Vec<(u64, u128)> = Vec::new();
        let mut take = |start: u128, end: u128| {
            if start >= end {
                return;
            }
            match ranges.last_mut() {
                Some(last) if last.1 == start => last.1 = end,
                _ => ranges.push((start as u64, end)),
            }
        };
        let first = points[0];
        if first.member == index {
            let last = points[points.len() - 1].point;
            // The arc that wraps: from after the last point, and from 0 up to the first.
            take(0, u128::from(first.point) + 1);
            take(u128::from(last) + 1, 1 << 64);
        }
        for pair in points.windows(2) {
            if pair[1].member == index {
                take(u128::from(pair[0].point) + 1, u128::from(pair[1].point) + 1);
            }
        }
        ranges.sort_unstable();
        // The wrapping arc's upper part sorts last; merge it with a range ending at 2^64.
        ranges.dedup_by(|b, a| {
            if a.1 == u128::from(b.0) {
                a.1 = b.1;
                true
            } else {
                false
            }
        });
        ranges
    }

    /// The API server's `shardSelector` for the namespaces `member` owns on a ring keyed by
    /// namespace (`shardRange(object.metadata.namespace, '0x…', '0x…') || …`); `None` on a ring
    /// keyed by name (the API server cannot shard by it), or when `member` owns everything or
    /// nothing.
    pub fn shard_selector(&self, member: &str) -> Option<String> {
        if self.key != RingKey::Namespace {
            return None;
        }
        let ranges = self.ranges(member);
        if ranges.is_empty() || ranges == [(0, 1 << 64)] {
            return None;
        }
        let mut selector = String::with_capacity(ranges.len() * 80);
        for (start, end) in ranges {
            if !selector.is_empty() {
                selector.push_str(" || ");
            }
            let _ = write!(
                selector,
                "shardRange(object.metadata.namespace, '0x{start:016x}', '0x{end:016x}')"
            );
        }
        Some(selector)
    }

    /// The share of the key-hash space `member` owns, from 0 to 1: the arcs that end at its
    /// points, each running from the point before. 0 for a member not on the ring.
    pub fn share(&self, member: &str) -> f64 {
        let Ok(index) = self.members.binary_search_by(|m| m.as_str().cmp(member)) else {
            return 0.0;
        };
        let points = self.placing_points();
        let Some(last) = points.last().map(|n| n.point) else {
            return 0.0;
        };
        if points.len() == 1 {
            return 1.0;
        }
        // A key belongs to the first point at or after its hash: each point owns the arc from
        // the point before it, and the first point the arc that wraps around from the last.
        let mut previous = last;
        let mut owned: u128 = 0;
        for node in &points {
            if node.member == index {
                owned += u128::from(node.point.wrapping_sub(previous));
            }
            previous = node.point;
        }
        // The arcs sum to 2^64.
        owned as f64 / 18_446_744_073_709_551_616.0
    }
}

/// Of `points` (every member's, collisions included, sorted by point, then member), those that
/// place keys: on a (vanishingly rare) collision the member that sorts first keeps the point,
/// so every implementation agrees.
fn placing(points: &[VirtualNode]) -> Vec<VirtualNode> {
    let mut placing = points.to_vec();
    placing.dedup_by_key(|n| n.point);
    placing
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, HashMap};

    use proptest::prelude::*;

    use super::*;

    #[test]
    fn shares_cover_the_hash_space_once() {
        let ring = Ring::new(["dispatcher-0", "dispatcher-1", "dispatcher-2"]);
        let shares: Vec<f64> = ring.members().iter().map(|m| ring.share(m)).collect();
        let total: f64 = shares.iter().sum();
        assert!((total - 1.0).abs() < 1e-9, "{shares:?}");
        // 128 points each: every share is near a third.
        assert!(shares.iter().all(|s| (0.2..0.46).contains(s)), "{shares:?}");
        // A sample of key hashes lands on each member in about its share.
        let mut counts: HashMap<&str, u32> = HashMap::new();
        for i in 0..30_000u32 {
            *counts
                .entry(ring.owner_of_hash(hash64(&i.to_le_bytes())).unwrap())
                .or_default() += 1;
        }
        for (member, share) in ring.members().iter().zip(&shares) {
            let sampled = f64::from(counts[member.as_str()]) / 30_000.0;
            assert!(
                (sampled - share).abs() < 0.02,
                "{member}: {sampled} vs {share}"
            );
        }
        assert_eq!(Ring::new(["only"]).share("only"), 1.0);
        assert_eq!(ring.share("dispatcher-9"), 0.0);
        assert_eq!(Ring::new(Vec::<String>::new()).share("x"), 0.0);
    }

    #[derive(serde::Deserialize)]
    struct Vectors {
        hashes: BTreeMap<String, String>,
        rings: Vec<RingVectors>,
    }

    #[derive(serde::Deserialize)]
    struct RingVectors {
        members: Vec<String>,
        owners: BTreeMap<String, String>,
    }

    /// The vectors were written by an independent implementation of keys.md
    /// (`testdata/gen_ring_vectors.py`); this one must agree with it on every key.
    #[test]
    fn agrees_with_the_reference_vectors() {
        let vectors: Vectors =
            serde_json::from_str(include_str!("../testdata/ring_vectors.json")).unwrap();
        for (key, hash) in &vectors.hashes {
            assert_eq!(hash64(key.as_bytes()).to_string(), *hash, "hash of {key}");
        }
        for ring in &vectors.rings {
            let built = Ring::new(ring.members.iter().cloned());
            for (key, owner) in &ring.owners {
                let parsed = RequestKey::parse(key).unwrap();
                assert_eq!(
                    built.owner(&parsed),
                    Some(owner.as_str()),
                    "{key} on {:?}",
                    ring.members
                );
            }
        }
    }

    #[test]
    fn a_namespace_ring_places_by_the_fnv_1a_hash_of_the_namespace() {
        // FNV-1a 64 reference values.
        assert_eq!(namespace_hash(""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(namespace_hash("a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(namespace_hash("foobar"), 0x8594_4171_f739_67e8);
        let by = RingKey::Namespace;
        assert_eq!(by.place("/ConfigMap/web/a"), namespace_hash("web"));
        assert_eq!(by.place("apps/Deployment/web/b"), namespace_hash("web"));
        assert_eq!(by.place("/Namespace//kube-system"), namespace_hash(""));
        assert_eq!(
            by.place_key(&RequestKey::new("", "ConfigMap", "web", "a")),
            namespace_hash("web")
        );
        assert_eq!(
            RingKey::Name.place("/ConfigMap/web/a"),
            hash64(b"/ConfigMap/web/a")
        );
        let ring = Ring::with_key(["d0", "d1", "d2"], RingKey::Namespace);
        for ns in ["web", "db", "kube-system", ""] {
            let owners: std::collections::HashSet<_> = (0..20)
                .map(|i| ring.owner(&RequestKey::new("", "ConfigMap", ns, format!("o-{i}"))))
                .collect();
            assert_eq!(owners.len(), 1, "the keys of {ns:?} are on one member");
        }
    }

    #[test]
    fn the_shard_selector_lists_the_members_ranges() {
        assert_eq!(Ring::new(["d0", "d1"]).shard_selector("d0"), None);
        let one = Ring::with_key(["d0"], RingKey::Namespace);
        assert_eq!(one.ranges("d0"), [(0, 1 << 64)]);
        assert_eq!(one.shard_selector("d0"), None, "all of it: no selector");
        let two = Ring::with_key(["d0", "d1"], RingKey::Namespace);
        assert_eq!(two.shard_selector("d9"), None);
        let selector = two.shard_selector("d0").unwrap();
        let ranges = two.ranges("d0");
        assert_eq!(selector.matches(" || ").count(), ranges.len() - 1);
        let (start, end) = ranges[0];
        assert!(selector.starts_with(&format!(
            "shardRange(object.metadata.namespace, '0x{start:016x}', '0x{end:016x}')"
        )));
        // Adjacent arcs of one member are merged: fewer ranges than points.
        assert!(
            ranges.len() < Ring::VIRTUAL_NODES as usize,
            "{}",
            ranges.len()
        );
    }

    #[test]
    fn empty_ring_owns_nothing() {
        assert_eq!(Ring::new(Vec::<String>::new()).owner_of_hash(42), None);
    }

    #[test]
    fn keys_spread_evenly_over_members() {
        let ring = Ring::new((0..3).map(|i| format!("dispatcher-{i}")));
        let mut counts: HashMap<&str, usize> = HashMap::new();
        for i in 0..30_000 {
            *counts
                .entry(
                    ring.owner_of_hash(hash64(format!("/ConfigMap/ns/cm-{i}").as_bytes()))
                        .unwrap(),
                )
                .or_default() += 1;
        }
        for (member, count) in counts {
            assert!(
                (7_000..13_000).contains(&count),
                "{member} owns {count} of 30000 keys"
            );
        }
    }

    proptest! {
        /// The points are those keys.md defines, `XXH64("<member>#<i>")`, sorted, each kept by
        /// the first member (in sorted order) that has it, whatever the spelling of the names.
        #[test]
        fn points_are_those_of_the_definition(members in prop::collection::btree_set("[a-zA-Z0-9.#-]{0,12}", 1..6)) {
            let members: Vec<String> = members.into_iter().collect();
            let mut expected: BTreeMap<u64, usize> = BTreeMap::new();
            for (index, member) in members.iter().enumerate() {
                for i in 0..Ring::VIRTUAL_NODES {
                    expected.entry(hash64(format!("{member}#{i}").as_bytes())).or_insert(index);
                }
            }
            let points: Vec<(u64, usize)> = Ring::new(members.clone())
                .placing_points()
                .into_iter()
                .map(|n| (n.point, n.member))
                .collect();
            prop_assert_eq!(points, expected.into_iter().collect::<Vec<_>>());
        }

        /// A ring derived by adding and removing members one at a time is the ring built over
        /// the members it ends with: the same points, collisions included, and owners.
        #[test]
        fn a_ring_changed_a_member_at_a_time_is_the_ring_of_its_members(
            changes in prop::collection::vec((any::<bool>(), 0u8..8), 1..24),
            hashes in prop::collection::vec(any::<u64>(), 1..50),
        ) {
            let mut ring = Ring::new(Vec::<String>::new());
            let mut members = std::collections::BTreeSet::new();
            for (add, n) in changes {
                let member = format!("replica-{n}");
                if add {
                    ring = ring.with_member(&member);
                    members.insert(member);
                } else {
                    ring = ring.without_member(&member);
                    members.remove(&member);
                }
            }
            let built = Ring::new(members);
            prop_assert_eq!(ring.members(), built.members());
            let points = |r: &Ring| r.points.iter().map(|n| (n.point, n.member)).collect::<Vec<_>>();
            prop_assert_eq!(points(&ring), points(&built));
            for hash in hashes {
                prop_assert_eq!(ring.owner_of_hash(hash), built.owner_of_hash(hash));
            }
        }

        #[test]
        fn member_order_does_not_matter(members in prop::collection::vec("[a-z0-9-]{1,12}", 1..6), key in any::<u64>()) {
            let forward = Ring::new(members.clone());
            let backward = Ring::new(members.iter().rev().cloned());
            prop_assert_eq!(forward.owner_of_hash(key), backward.owner_of_hash(key));
        }

        /// A member's ranges hold exactly the hashes it owns, and the members' ranges together
        /// cover the hash space once.
        #[test]
        fn ranges_hold_what_a_member_owns(n in 1usize..5, hashes in prop::collection::vec(any::<u64>(), 1..200)) {
            let ring = Ring::with_key((0..n).map(|i| format!("d{i}")), RingKey::Namespace);
            let all: Vec<(String, Vec<(u64, u128)>)> = ring
                .members()
                .iter()
                .map(|m| (m.clone(), ring.ranges(m)))
                .collect();
            let total: u128 = all.iter().flat_map(|(_, r)| r).map(|(s, e)| e - u128::from(*s)).sum();
            prop_assert_eq!(total, 1u128 << 64);
            for (_, ranges) in &all {
                prop_assert!(ranges.windows(2).all(|w| w[0].1 < u128::from(w[1].0)), "sorted, disjoint, merged");
            }
            let points: Vec<u64> = all.iter().flat_map(|(_, r)| r).flat_map(|(s, e)| [*s, (*e - 1) as u64]).collect();
            for h in hashes.into_iter().chain(points).chain([0, u64::MAX]) {
                let owner = ring.owner_of_hash(h).unwrap();
                for (member, ranges) in &all {
                    let inside = ranges.iter().any(|(s, e)| *s <= h && u128::from(h) < *e);
                    prop_assert_eq!(inside, member == owner, "hash {:#x}: owner {}, {} has it: {}", h, owner, member, inside);
                }
            }
        }

        /// Adding a member moves keys only onto the new member, never between old ones.
        #[test]
        fn adding_a_member_moves_keys_only_to_it(n in 1usize..6, keys in prop::collection::vec(any::<u64>(), 1..200)) {
            let before = Ring::new((0..n).map(|i| format!("dispatcher-{i}")));
            let after = Ring::new((0..=n).map(|i| format!("dispatcher-{i}")));
            let new_member = format!("dispatcher-{n}");
            for key in keys {
                let (old, new) = (before.owner_of_hash(key).unwrap(), after.owner_of_hash(key).unwrap());
                prop_assert!(old == new || new == new_member, "key {} moved from {} to {}", key, old, new);
            }
        }
    }
}
