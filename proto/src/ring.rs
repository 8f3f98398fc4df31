//! The consistent-hash ring that splits request keys among dispatchers.
//!
//! The placement rules are part of the wire contract (`proto/kubedispatch/v1/keys.md`): every
//! member has [`Ring::VIRTUAL_NODES`] points at `XXH64("<member>#<i>")`, and a key belongs to the
//! first point at or after its hash, wrapping around.

use std::hash::{Hash, Hasher};

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

/// An immutable ring over a set of members. Build a new one when membership changes.
#[derive(Clone)]
pub struct Ring {
    members: Vec<String>,
    ring: HashRing<VirtualNode, BuildNoHashHasher<u64>>,
}

impl std::fmt::Debug for Ring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ring")
            .field("members", &self.members)
            .finish()
    }
}

impl Ring {
    /// Virtual nodes per member.
    pub const VIRTUAL_NODES: u32 = 128;

    /// A ring over `members`; order and duplicates do not matter.
    pub fn new<I, S>(members: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let mut members: Vec<String> = members.into_iter().map(Into::into).collect();
        members.sort();
        members.dedup();
        let mut ring = HashRing::with_hasher(BuildNoHashHasher::default());
        ring.batch_add(Self::virtual_nodes(&members));
        Self { members, ring }
    }

    /// The points of sorted, distinct `members`.
    fn virtual_nodes(members: &[String]) -> Vec<VirtualNode> {
        let mut taken = std::collections::HashSet::new();
        let mut nodes = Vec::with_capacity(members.len() * Self::VIRTUAL_NODES as usize);
        for (index, member) in members.iter().enumerate() {
            for i in 0..Self::VIRTUAL_NODES {
                let point = hash64(format!("{member}#{i}").as_bytes());
                // On a (vanishingly rare) collision the member that sorts first keeps the
                // point, so every implementation agrees.
                if taken.insert(point) {
                    nodes.push(VirtualNode {
                        point,
                        member: index,
                    });
                }
            }
        }
        nodes
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

    /// The member that owns a key hash; `None` when the ring is empty.
    pub fn owner_of_hash(&self, key_hash: u64) -> Option<&str> {
        let node = self.ring.get(&key_hash)?;
        Some(self.members[node.member].as_str())
    }

    /// The member that owns a request key; `None` when the ring is empty.
    pub fn owner(&self, key: &RequestKey) -> Option<&str> {
        self.owner_of_hash(key.hash64())
    }

    /// The share of the key-hash space `member` owns, from 0 to 1: the arcs that end at its
    /// points, each running from the point before. 0 for a member not on the ring.
    pub fn share(&self, member: &str) -> f64 {
        let Ok(index) = self.members.binary_search_by(|m| m.as_str().cmp(member)) else {
            return 0.0;
        };
        let mut points = Self::virtual_nodes(&self.members);
        points.sort_unstable_by_key(|n| n.point);
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
        #[test]
        fn member_order_does_not_matter(members in prop::collection::vec("[a-z0-9-]{1,12}", 1..6), key in any::<u64>()) {
            let forward = Ring::new(members.clone());
            let backward = Ring::new(members.iter().rev().cloned());
            prop_assert_eq!(forward.owner_of_hash(key), backward.owner_of_hash(key));
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
