//! When the keys a dispatcher serves grow, so that a list beside its watch must show it what
//! changed in them ([`Slice::may_serve_more_than`]), and when its groups have kept up with them
//! all the same ([`Slice::kept_since`]).
//!
//! While a dispatcher is on its ring and hands nothing out (warming up to join, waiting out its
//! previous process, fenced), every group records every event of each key it owns on the ring
//! of the moment ([`crate::transit::Transit`] "keeps" them). When the gate then opens, the keys
//! served grow ([`Slice::may_serve_more_than`]), and a list beside the watch would show the
//! objects of the new ones; but a watch whose own list began within that stretch has shown
//! each group every such key already, if every key served now was owned on every ring of the
//! stretch. A key is owned by the member nearest to it, so one owned here among more members is
//! owned here among fewer: that holds when every member of the stretch's rings is on the ring
//! served now. The slices carry what the watch needs to judge it ([`Slice::kept_since`]),
//! since a watch may never see a slice that came and went between two it saw.

use std::{collections::BTreeSet, sync::Arc};

use kube_dispatch_proto::Ring;

use super::Slice;

/// A stretch of slices on which the dispatcher was on its ring and handed nothing out.
#[derive(Debug, PartialEq, Eq)]
struct Stretch {
    /// The number of its first slice.
    since: u64,
    /// Every member of its rings.
    members: BTreeSet<String>,
}

/// A slice's number (later slices of a process have greater ones) and the stretch it is in,
/// or, for the slice that ends one, the stretch it ends.
#[derive(Clone, Debug, Default)]
pub(super) struct Keeping {
    number: u64,
    stretch: Option<Arc<Stretch>>,
}

/// Numbers the slices of a [`super::Handover`] and follows their stretches.
#[derive(Debug, Default)]
pub(super) struct Stretches {
    last: u64,
    current: Option<Arc<Stretch>>,
}

impl Stretches {
    /// What the next slice of `identity` carries, on `ring`, handing nothing out if
    /// `closed`.
    pub(super) fn next(&mut self, identity: &str, ring: &Ring, closed: bool) -> Keeping {
        self.last += 1;
        let number = self.last;
        if !(closed && ring.contains(identity)) {
            // The first slice after a stretch carries it, for the gate's opening.
            let stretch = self.current.take();
            return Keeping { number, stretch };
        }
        let stretch = match self.current.take() {
            Some(s) if ring.members().iter().all(|m| s.members.contains(m)) => s,
            Some(s) => Arc::new(Stretch {
                since: s.since,
                members: s.members.iter().chain(ring.members()).cloned().collect(),
            }),
            None => Arc::new(Stretch {
                since: number,
                members: ring.members().iter().cloned().collect(),
            }),
        };
        self.current = Some(stretch.clone());
        Keeping {
            number,
            stretch: Some(stretch),
        }
    }
}

impl Slice {
    /// Whether this slice may serve keys `earlier` did not, so that only a list can show
    /// what changed in them meanwhile. A dispatcher serves the keys it owns on its ring and on
    /// its settled ring, which are the keys it owns on the union of both (a key is owned by the
    /// member nearest to it, and one nearest among two sets of members is nearest among both).
    /// So the served set grows only when this dispatcher starts serving, or when a member drops
    /// out of that union: a handover that completes after a member left, or a member that
    /// joined and left again before any handover to it completed (a dispatcher crashing as it
    /// starts, a scale-up undone), whose keys come back here without a handover and whose
    /// changes meanwhile reached no queue (deletions are remembered apart, see `Transit`).
    /// A member joining, dying or leaving while the handover is pending, or a join completing,
    /// lists nothing.
    pub fn may_serve_more_than(&self, earlier: &Slice) -> bool {
        let Some(settled) = &self.settled else {
            return false;
        };
        let Some(before) = earlier.settled.as_ref().filter(|_| earlier.is_member()) else {
            return self.is_member();
        };
        let now = |m: &String| self.ring.members().contains(m) || settled.members().contains(m);
        earlier
            .ring
            .members()
            .iter()
            .chain(before.members())
            .any(|m| !now(m))
    }

    /// Whether this slice may hold keys (own them on its ring, a handover keeping them from
    /// being served) that `earlier` neither held nor had indexed, so that only a list can
    /// show the index of held keys which of them exist (`crate::transit::Transit`): this
    /// dispatcher serves, a handover is pending, and a member of `earlier`'s ring is not on
    /// this one (a member died or left: its keys come here), or `earlier` was not serving or
    /// not on its ring (whatever it indexed then, a queue trimmed to this slice forgets the
    /// keys it does not serve). A dispatcher that hands nothing out keeps every key it owns
    /// in its queue instead, and one that serves every key it owns holds none.
    pub fn may_hold_more_than(&self, earlier: &Slice) -> bool {
        if !self.holds_keys() {
            return false;
        }
        if earlier.settled.is_none() || !earlier.is_member() {
            return true;
        }
        earlier
            .ring
            .members()
            .iter()
            .any(|m| !self.ring.contains(m))
    }

    /// Whether this dispatcher serves while a handover holds keys it owns on its ring (a
    /// member left it): the keys whose objects its groups index apart from their queues.
    pub fn holds_keys(&self) -> bool {
        self.settled.is_some() && self.is_member() && !self.is_settled()
    }

    /// Whether every key this slice may serve ([`Slice::may_serve`]) `other` may serve too;
    /// with `ring_only`, of the keys each owns on its ring alone. Judged by the members (a key
    /// owned here among more members is owned here among fewer): false where not certain.
    pub fn may_serve_within(&self, other: &Slice, ring_only: bool) -> bool {
        if !other.is_member() {
            return true;
        }
        if !self.is_member() || self.ring.key() != other.ring.key() {
            return false;
        }
        let rings = |s: &Slice| -> Vec<Arc<Ring>> {
            let settled = s.settled.clone().filter(|_| !ring_only);
            std::iter::once(s.ring.clone())
                .chain(settled)
                .filter(|r| r.contains(&s.identity))
                .collect()
        };
        let theirs = rings(other);
        rings(self).iter().all(|mine| {
            (theirs.iter()).any(|their| their.members().iter().all(|m| mine.contains(m)))
        })
    }

    /// This slice's number: a later slice of the same process has a greater one (0 for a
    /// fixed slice).
    pub fn number(&self) -> u64 {
        self.keeping.number
    }

    /// Whether this slice is the first of a stretch in which the dispatcher is on its ring and
    /// hands nothing out: published even with the ring and settled ring of the slice before
    /// (a process's first slice, [`Slice::closed`]), so that a list a watch begins under it
    /// counts as begun within the stretch.
    pub fn begins_a_stretch(&self) -> bool {
        let stretch = self.keeping.stretch.as_ref();
        stretch.is_some_and(|s| s.since == self.keeping.number)
    }

    /// Whether every group has kept up with every key this slice serves since a list of its
    /// watch began under slice number `listed`, so that the list beside the stream the growth
    /// of the served keys calls for would show nothing new: this slice opens the gate on the
    /// ring it owns, and ends a stretch in which the dispatcher handed nothing out, began no
    /// later than that list, and saw only rings whose members are all on this one (see the
    /// module's doc). A group that joined the watch after its list and was shown objects by a
    /// list beside it kept only keys served; its watch must not ask.
    pub fn kept_since(&self, listed: u64) -> bool {
        self.is_settled()
            && self.is_member()
            && self.keeping.stretch.as_ref().is_some_and(|s| {
                s.since <= listed && s.members.iter().all(|m| self.ring.contains(m))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring(members: &[&str]) -> Ring {
        Ring::new(members.iter().map(|m| (*m).to_owned()))
    }

    /// A slice of d0 on `members` with `keeping`, its gate open on that ring.
    fn opened(members: &[&str], keeping: Keeping) -> Slice {
        let mut slice = Slice::fixed("d0", ring(members));
        slice.keeping = keeping;
        slice
    }

    #[test]
    fn a_warm_up_on_one_ring_keeps_what_the_gate_opens() {
        let mut s = Stretches::default();
        let all = ring(&["d0", "d1", "d2"]);
        let first = s.next("d0", &all, true);
        let listed = first.number;
        let second = s.next("d0", &all, true);
        let begins = |keeping: &Keeping| opened(&["d0"], keeping.clone()).begins_a_stretch();
        assert!(
            begins(&first) && !begins(&second),
            "only the first slice begins it"
        );
        let open = opened(&["d0", "d1", "d2"], s.next("d0", &all, false));
        assert!(open.kept_since(listed));
        assert!(
            !open.kept_since(listed - 1),
            "a list that began before the stretch"
        );
        let after = opened(&["d0", "d1", "d2"], s.next("d0", &all, false));
        assert!(!after.kept_since(listed), "only the slice that ends it");
    }

    #[test]
    fn a_member_that_left_during_the_stretch_gave_keys_that_were_not_kept() {
        let mut s = Stretches::default();
        let listed = s.next("d0", &ring(&["d0", "d1", "d2"]), true).number;
        s.next("d0", &ring(&["d0", "d1"]), true);
        let open = opened(&["d0", "d1"], s.next("d0", &ring(&["d0", "d1"]), false));
        assert!(
            !open.kept_since(listed),
            "d2's keys came here after the list"
        );
    }

    #[test]
    fn a_member_that_joined_during_the_stretch_only_took_keys_away() {
        let mut s = Stretches::default();
        let listed = s.next("d0", &ring(&["d0", "d1"]), true).number;
        s.next("d0", &ring(&["d0", "d1", "d2"]), true);
        let open = opened(
            &["d0", "d1", "d2"],
            s.next("d0", &ring(&["d0", "d1", "d2"]), false),
        );
        assert!(open.kept_since(listed));
    }

    #[test]
    fn a_slice_off_the_ring_or_handing_out_ends_the_stretch() {
        let mut s = Stretches::default();
        let all = ring(&["d0", "d1"]);
        let listed = s.next("d0", &all, true).number;
        s.next("d0", &ring(&["d1"]), true);
        s.next("d0", &all, true);
        let open = opened(&["d0", "d1"], s.next("d0", &all, false));
        assert!(!open.kept_since(listed), "off its ring, it kept nothing");
        let listed = s.next("d0", &all, true).number;
        let open = opened(&["d0", "d1"], s.next("d0", &all, false));
        assert!(
            open.kept_since(listed),
            "a new stretch from its first slice"
        );
    }

    #[test]
    fn a_gate_that_opens_on_another_ring_than_its_own_needs_the_list() {
        let mut s = Stretches::default();
        let all = ring(&["d0", "d1"]);
        let listed = s.next("d0", &all, true).number;
        let mut open = opened(&["d0", "d1"], s.next("d0", &all, false));
        open.settled = Some(Arc::new(ring(&["d0"])));
        assert!(!open.kept_since(listed), "a handover still pending");
        assert!(
            !Slice::fixed("d0", all).kept_since(0),
            "a fixed slice keeps nothing"
        );
    }
}
