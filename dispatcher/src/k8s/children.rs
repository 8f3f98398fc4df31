//! The controlling owner each owned object was last seen with, per owner kind a watch feeds:
//! what tells an owner of a change the object itself no longer shows.
//!
//! - A child whose controlling owner changes names only the new owner; the old one, which
//!   lost a child, is told from here.
//! - A child deleted while the watch was away (a watch gap that ends in a re-list) is never
//!   seen again: when the re-list ends, every child it did not show is gone, and its owner is
//!   told.
//!
//! Bound: one entry per object of the watch that has a controlling owner of a subscribed kind
//! (its key and its owner's, about 150 bytes), removed when the object is deleted, loses its
//! owner or is missing from a re-list; dropped with the watch.

use std::collections::HashMap;

use kube_dispatch_core::subscription::OwnerKind;

/// Per owner kind, each child's key to its owner's key and the epoch it was last seen in.
#[derive(Debug, Default)]
pub(super) struct Children {
    by_kind: HashMap<OwnerKind, HashMap<String, (String, u32)>>,
}

impl Children {
    /// Owned objects indexed, over every owner kind.
    pub(super) fn len(&self) -> usize {
        self.by_kind.values().map(HashMap::len).sum()
    }

    /// Records `child` as seen in `epoch` with `owner` (its controlling owner of `kind` now, if
    /// any), or deleted; returns the owners to tell: the current one, and the one it had
    /// before if that was another.
    pub(super) fn seen(
        &mut self,
        kind: &OwnerKind,
        child: &str,
        owner: Option<String>,
        epoch: u32,
        deleted: bool,
    ) -> Vec<String> {
        let children = self.by_kind.entry(kind.clone()).or_default();
        let before = match (&owner, deleted) {
            (Some(owner), false) => children
                .insert(child.to_owned(), (owner.clone(), epoch))
                .map(|(before, _)| before),
            _ => children.remove(child).map(|(before, _)| before),
        };
        let mut tell: Vec<String> = owner.into_iter().collect();
        if let Some(before) = before
            && !tell.contains(&before)
        {
            tell.push(before);
        }
        tell
    }

    /// Records `child`, shown by a list beside the watch with `owner`, unless the watch knows it
    /// already: the watch's stream is the authority on what it has shown (the list may be
    /// older).
    pub(super) fn listed(&mut self, kind: &OwnerKind, child: &str, owner: String, epoch: u32) {
        self.by_kind
            .entry(kind.clone())
            .or_default()
            .entry(child.to_owned())
            .or_insert((owner, epoch));
    }

    /// A re-list of `epoch` ended: the children it did not show were deleted while the watch
    /// was away. Forgets them and the kinds no longer subscribed (`subscribed`); returns their
    /// owners, per kind, each once.
    pub(super) fn swept(
        &mut self,
        epoch: u32,
        subscribed: impl Fn(&OwnerKind) -> bool,
    ) -> HashMap<OwnerKind, Vec<String>> {
        self.by_kind.retain(|kind, _| subscribed(kind));
        let mut tell: HashMap<OwnerKind, Vec<String>> = HashMap::new();
        for (kind, children) in &mut self.by_kind {
            children.retain(|_, (owner, seen)| {
                if *seen == epoch {
                    return true;
                }
                tell.entry(kind.clone()).or_default().push(owner.clone());
                false
            });
        }
        for owners in tell.values_mut() {
            owners.sort_unstable();
            owners.dedup();
        }
        tell
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind() -> OwnerKind {
        OwnerKind {
            group: "apps".into(),
            version: "v1".into(),
            kind: "Deployment".into(),
        }
    }

    #[test]
    fn an_owner_that_loses_a_child_is_told() {
        let mut c = Children::default();
        let k = kind();
        assert_eq!(c.seen(&k, "rs-1", Some("a".into()), 1, false), ["a"]);
        assert_eq!(c.seen(&k, "rs-1", Some("a".into()), 1, false), ["a"]);
        // Adopted by b: both hear of it.
        assert_eq!(c.seen(&k, "rs-1", Some("b".into()), 1, false), ["b", "a"]);
        // Orphaned: b, which lost it, hears; deleted afterwards: nobody is left to tell.
        assert_eq!(c.seen(&k, "rs-1", None, 1, false), ["b"]);
        assert!(c.seen(&k, "rs-1", None, 1, true).is_empty());
        assert_eq!(c.len(), 0);
    }

    #[test]
    fn a_list_beside_the_watch_never_overrides_it() {
        let mut c = Children::default();
        let k = kind();
        c.seen(&k, "rs-1", Some("b".into()), 1, false);
        c.listed(&k, "rs-1", "a".into(), 1);
        // Deleted: b, which the watch knew, is told, not the list's a.
        assert_eq!(c.seen(&k, "rs-1", Some("b".into()), 1, true), ["b"]);
        c.seen(&k, "rs-2", Some("b".into()), 1, false);
        c.listed(&k, "rs-2", "a".into(), 1);
        assert_eq!(c.seen(&k, "rs-2", None, 1, false), ["b"]);
    }

    #[test]
    fn a_relist_tells_the_owners_of_children_it_did_not_show() {
        let mut c = Children::default();
        let k = kind();
        for (child, owner) in [("rs-1", "a"), ("rs-2", "a"), ("rs-3", "b"), ("rs-4", "c")] {
            c.seen(&k, child, Some(owner.into()), 1, false);
        }
        // The re-list of epoch 2 shows rs-3 only.
        c.seen(&k, "rs-3", Some("b".into()), 2, false);
        let told = c.swept(2, |_| true);
        assert_eq!(told[&k], ["a", "c"]);
        assert_eq!(c.len(), 1);
        // A kind nobody subscribes to any more is forgotten.
        assert!(c.swept(2, |_| false).is_empty());
        assert_eq!(c.len(), 0);
    }
}
