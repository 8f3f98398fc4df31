//! An owner's children as a reconcile request carries them, within the request's bytes.

use super::KnownChild;

/// Most children one reconcile request carries; past it the request says its children were
/// cut ([`OwnerChildren::truncated`]).
pub const MAX_CHILDREN_PER_REQUEST: usize = 1000;

/// Bytes a child takes in a request besides its key, uid and resourceVersion (field tags and
/// lengths, the version and the key's parts, which repeat it).
const CHILD_WIRE_OVERHEAD: usize = 48;

/// Bytes a child's body takes in a request besides its own: its field's tag and length.
const BODY_WIRE_OVERHEAD: usize = 8;

/// An owner's children as its request carries them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OwnerChildren {
    /// In key order.
    pub children: Vec<KnownChild>,
    /// Whether the watch had shown every child when they were read ([`super::ChildIndex`]).
    pub complete: bool,
    /// Whether more than [`MAX_CHILDREN_PER_REQUEST`] were known, and the rest left out.
    pub truncated: bool,
}

impl OwnerChildren {
    /// Makes them take at most `bytes` in a request: leaves out the last children's bodies
    /// first (their reconcile reads those children), then the last children (then they are
    /// truncated).
    pub fn fit(&mut self, bytes: usize) {
        let mut total = self.wire_bound();
        for child in self.children.iter_mut().rev() {
            if total <= bytes {
                break;
            }
            if let Some(body) = child.body.take() {
                total -= body.len() + BODY_WIRE_OVERHEAD;
            }
        }
        while self.wire_bound() > bytes && !self.children.is_empty() {
            let keep = self.children.len() / 2;
            self.children.truncate(keep);
            self.truncated = true;
        }
    }

    /// Leaves out every child's body (for a group none of whose sessions takes them).
    pub fn without_bodies(&mut self) {
        for child in &mut self.children {
            child.body = None;
        }
    }

    /// An upper bound of the bytes they take in a request.
    pub fn wire_bound(&self) -> usize {
        self.children
            .iter()
            .map(|c| {
                2 * c.key.len()
                    + c.uid.len()
                    + c.resource_version.len()
                    + CHILD_WIRE_OVERHEAD
                    + c.body.as_ref().map_or(0, |b| b.len() + BODY_WIRE_OVERHEAD)
            })
            .sum()
    }
}
