//! The sessions on the dispatcher Leases, as pure logic (time passed in): the sessions this
//! dispatcher lists on its own Lease ([`ListedSessions`]), and the reports it carries that sessions of
//! a member that died have ended ([`Relayed`]). `dispatcher/HANDOVER.md`, "Ending the wait for a
//! member that died, by reports", gives the rule; `proto/kubedispatch/v1/leases.md` the
//! annotations.
//!
//! A dispatcher hands a session keys only once a Lease write listing it was accepted, and keeps
//! a session listed until nothing it handed out can still run: so when it dies, its last
//! accepted write names every session whose reconciles the others must see end.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    time::{Duration, Instant},
};

use kube_dispatch_proto::lease::{ended_value, sessions_value};

/// Most sessions a Lease lists; past it the Lease says `overflow`, and the others wait out the
/// handover bound for this dispatcher if it dies. Each costs 17 bytes of the Lease.
pub const MAX_LISTED_SESSIONS: usize = 1024;

/// Most reports of ended sessions a Lease carries (each about 30 bytes); past it further
/// reports are not carried, and the members they would have ended the wait for are waited out
/// for the bound.
pub const MAX_RELAYED: usize = 1024;

/// The sessions this dispatcher lists on its Lease.
#[derive(Debug)]
pub struct ListedSessions {
    /// How long a session stays listed after it ended here: the handover bound, past which
    /// nothing it handed out can still run.
    keep: Duration,
    /// Listed sessions by tag: when each was opened (a sequence number), and when it ended.
    sessions: HashMap<u64, Listed>,
    /// The sequence number of the next session opened.
    next: u64,
    /// Every session opened before this was listed by an accepted write.
    listed_before: u64,
    /// Ended sessions were forgotten before the bound, to keep the listing within its bound:
    /// until then the Lease says `overflow`.
    overflow_until: Option<Instant>,
    /// No Lease (a fixed ring): every session may be handed keys at once.
    unlimited: bool,
    /// Every session opened before this was in a write made (accepted or not yet).
    made_before: u64,
    /// Writes made so far: each is numbered.
    writes: u64,
    /// A session a write made listed ended idle when this many writes were made: until a later
    /// one is accepted, the Lease may list it, and a write is wanted at once.
    unlist: Option<u64>,
    /// The tags of those sessions, at most [`MAX_LISTED_SESSIONS`] (past it a repeated close of
    /// one is not recognised), cleared with `unlist`.
    unlisting: BTreeSet<u64>,
}

#[derive(Debug)]
struct Listed {
    opened: u64,
    ended: Option<Instant>,
}

/// What the next Lease write lists, and what to tell the listing once it is accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionsWrite {
    /// The value of `kube-dispatch.dev/sessions`.
    pub value: String,
    /// Pass to [`ListedSessions::written`] once the write is accepted.
    pub through: u64,
    /// The write's number among those made.
    pub number: u64,
}

impl ListedSessions {
    /// A listing whose ended sessions stay listed for `keep` (the handover bound).
    pub fn new(keep: Duration) -> Self {
        Self {
            keep,
            sessions: HashMap::new(),
            next: 0,
            listed_before: 0,
            overflow_until: None,
            unlimited: false,
            made_before: 0,
            writes: 0,
            unlist: None,
            unlisting: BTreeSet::new(),
        }
    }

    /// No Lease is written (a fixed ring): every session may be handed keys at once.
    pub fn unlimited() -> Self {
        Self {
            unlimited: true,
            ..Self::new(Duration::ZERO)
        }
    }

    /// A session with tag `tag` was opened: listed by the next write, and handed no key until
    /// that write is accepted.
    pub fn opened(&mut self, tag: u64) {
        let opened = self.next;
        self.next += 1;
        self.sessions.insert(
            tag,
            Listed {
                opened,
                ended: None,
            },
        );
    }

    /// The session with tag `tag` ended here at `now` (closed, expired, replaced): it stays
    /// listed for the handover bound, since what it handed out may still run that long, unless
    /// it ended `idle` (nothing in flight: each key it was handed acknowledged, or run out,
    /// the same fence this dispatcher trusts when it hands such a key out again), when the
    /// next write, wanted at once ([`ListedSessions::unwritten`]), lists it no more. Were this
    /// dispatcher to die, the others (and its own next process) would otherwise wait for a
    /// report of it from a replica that may have no reason to send one (it closed the session,
    /// no longer assigned this dispatcher). Only the first end counts: a session ended with
    /// keys in flight stays listed, whatever a later end of it says.
    ///
    /// Returns, for a session ended idle that a write made may list, the number of writes made
    /// then: the Lease lists it no more once a write numbered above it is accepted
    /// ([`SessionsWrite::number`]).
    pub fn ended(&mut self, tag: u64, now: Instant, idle: bool) -> Option<u64> {
        // While the Lease says `overflow`, a write would not change it. (A dispatcher that
        // waits out a member that died writes `overflow` too; its writes for this stay spaced.)
        let overflowing = self.overflow_until.is_some_and(|until| now < until)
            || self.sessions.len() > MAX_LISTED_SESSIONS;
        let mut unlisted_after = None;
        match self.sessions.get_mut(&tag) {
            Some(s) if idle && s.ended.is_none() => {
                // A write made may list it, accepted or not yet.
                if s.opened < self.made_before && !overflowing {
                    self.unlist = Some(self.writes);
                    unlisted_after = Some(self.writes);
                    if self.unlisting.len() < MAX_LISTED_SESSIONS {
                        self.unlisting.insert(tag);
                    }
                }
                self.sessions.remove(&tag);
            }
            Some(s) => {
                s.ended.get_or_insert(now);
            }
            None => {}
        }
        // Sessions opened and ended in a storm (reconnects, a client that churns) would keep
        // the listing growing for the bound: past twice its bound the oldest ended ones are
        // forgotten, and the Lease says `overflow` (the others wait out the bound) until
        // they would have been.
        if self.sessions.len() > 2 * MAX_LISTED_SESSIONS {
            let mut ended: Vec<(Instant, u64)> = self
                .sessions
                .iter()
                .filter_map(|(tag, s)| Some((s.ended?, *tag)))
                .collect();
            ended.sort_unstable();
            let excess = self.sessions.len() - MAX_LISTED_SESSIONS;
            for (_, tag) in ended.into_iter().take(excess) {
                self.sessions.remove(&tag);
            }
            self.overflow_until = Some(now + self.keep);
        }
        unlisted_after
    }

    /// While the session with tag `tag`, ended idle, may still be listed (a write made may list
    /// it, and no later one is accepted yet): what [`ListedSessions::ended`] returned for the
    /// last such session.
    pub fn unlisting(&self, tag: u64) -> Option<u64> {
        self.unlist.filter(|_| self.unlisting.contains(&tag))
    }

    /// Whether the session with tag `tag` may be handed keys: an accepted write lists it.
    pub fn may_hand_out(&self, tag: u64) -> bool {
        self.unlimited
            || self
                .sessions
                .get(&tag)
                .is_some_and(|s| s.opened < self.listed_before && s.ended.is_none())
    }

    /// Whether the Lease should be written for sessions: one waits for a write to list it, or
    /// one a write listed ended idle and no write accepted since lists it no more.
    pub fn unwritten(&self) -> bool {
        !self.unlimited && (self.listed_before < self.next || self.unlist.is_some())
    }

    /// What the next Lease write lists at `now`; sessions that ended longer than the bound ago
    /// are listed no more.
    pub fn write(&mut self, now: Instant) -> SessionsWrite {
        let keep = self.keep;
        self.made_before = self.next;
        self.writes += 1;
        self.sessions.retain(|_, s| {
            s.ended
                .is_none_or(|at| now.saturating_duration_since(at) < keep)
        });
        let tags: BTreeSet<u64> = self.sessions.keys().copied().collect();
        let forgot = self.overflow_until.is_some_and(|until| now < until);
        SessionsWrite {
            value: sessions_value(&tags, forgot || tags.len() > MAX_LISTED_SESSIONS),
            through: self.next,
            number: self.writes,
        }
    }

    /// A write made from [`ListedSessions::write`] was accepted: the sessions it listed may be
    /// handed keys, and those that ended idle before it was made are listed no more.
    pub fn written(&mut self, write: &SessionsWrite) {
        self.listed_before = self.listed_before.max(write.through);
        if self.unlist.is_some_and(|made| write.number > made) {
            self.unlist = None;
            self.unlisting.clear();
        }
    }

    /// Sessions listed, for metrics.
    pub fn len(&self) -> usize {
        self.sessions.len()
    }

    /// Whether no session is listed.
    pub fn is_empty(&self) -> bool {
        self.sessions.is_empty()
    }
}

/// Reports this dispatcher carries on its Lease: sessions of members that died that replicas
/// reported ended to it.
#[derive(Debug, Default)]
pub struct Relayed {
    /// Per member, each session's tag and when it was reported.
    reports: BTreeMap<String, BTreeMap<u64, Instant>>,
}

impl Relayed {
    /// Carries the report that session `tag` of `member` ended, made at `now`. Returns whether
    /// it is new (the Lease should be written at once); one past [`MAX_RELAYED`] is dropped.
    pub fn report(&mut self, member: &str, tag: u64, now: Instant) -> bool {
        if self
            .reports
            .get(member)
            .is_some_and(|tags| tags.contains_key(&tag))
        {
            return false;
        }
        if self.len() >= MAX_RELAYED {
            return false;
        }
        self.reports
            .entry(member.to_owned())
            .or_default()
            .insert(tag, now);
        true
    }

    /// The value of `kube-dispatch.dev/ended-sessions` at `now`, after dropping reports older
    /// than `keep` (the handover bound: by then every member waits no more for the one it
    /// names, and a member that comes back lists new sessions).
    pub fn value(&mut self, now: Instant, keep: Duration) -> String {
        for tags in self.reports.values_mut() {
            tags.retain(|_, at| now.saturating_duration_since(*at) < keep);
        }
        self.reports.retain(|_, tags| !tags.is_empty());
        let ended: BTreeMap<String, BTreeSet<u64>> = self
            .reports
            .iter()
            .map(|(member, tags)| (member.clone(), tags.keys().copied().collect()))
            .collect();
        ended_value(&ended)
    }

    /// Reports carried.
    pub fn len(&self) -> usize {
        self.reports.values().map(BTreeMap::len).sum()
    }

    /// Whether none is carried.
    pub fn is_empty(&self) -> bool {
        self.reports.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use kube_dispatch_proto::lease::{parse_ended, parse_sessions};

    use super::*;

    const SEC: Duration = Duration::from_secs(1);

    /// A session is handed keys only once a write that lists it is accepted; a session opened
    /// after the write was made waits for the next; an ended one stays listed for the bound.
    #[test]
    fn a_session_is_handed_keys_once_an_accepted_write_lists_it() {
        let t0 = Instant::now();
        let mut l = ListedSessions::new(10 * SEC);
        l.opened(1);
        assert!(!l.may_hand_out(1) && l.unwritten());
        let write = l.write(t0);
        assert_eq!(parse_sessions(&write.value), Some(BTreeSet::from([1])));
        l.opened(2);
        l.written(&write);
        assert!(l.may_hand_out(1) && !l.may_hand_out(2) && l.unwritten());
        let write = l.write(t0);
        l.written(&write);
        assert!(l.may_hand_out(2) && !l.unwritten());
        // Ended with keys in flight: listed for the bound, handed nothing more.
        l.ended(1, t0 + SEC, false);
        assert!(!l.may_hand_out(1));
        let listed = |l: &mut ListedSessions, at| parse_sessions(&l.write(at).value).unwrap();
        assert_eq!(listed(&mut l, t0 + 10 * SEC), BTreeSet::from([1, 2]));
        assert_eq!(listed(&mut l, t0 + 11 * SEC), BTreeSet::from([2]));
        // Ended with nothing in flight: listed no more from the next write.
        l.opened(3);
        let write = l.write(t0 + 11 * SEC);
        l.written(&write);
        assert!(!l.unwritten());
        let made = l.ended(3, t0 + 12 * SEC, true);
        assert!(!l.may_hand_out(3));
        assert!(l.unwritten(), "a write that lists it no more is wanted");
        assert_eq!(
            made,
            Some(write.number),
            "listed until a later write is accepted"
        );
        assert_eq!(l.unlisting(3), made);
        assert_eq!(l.unlisting(2), None, "not ended idle");
        let write = l.write(t0 + 12 * SEC);
        assert_eq!(parse_sessions(&write.value), Some(BTreeSet::from([2])));
        assert!(l.unwritten(), "until that write is accepted");
        assert!(write.number > made.unwrap_or(u64::MAX));
        l.written(&write);
        assert!(!l.unwritten(), "that write lists it no more");
        assert_eq!(l.unlisting(3), None);
        // Ended idle while the write that lists it is not yet accepted: another is wanted.
        l.opened(5);
        let write = l.write(t0 + 12 * SEC);
        assert_eq!(l.ended(5, t0 + 12 * SEC, true), Some(write.number));
        l.written(&write);
        assert!(l.unwritten(), "the write accepted lists it");
        let write = l.write(t0 + 12 * SEC);
        assert_eq!(parse_sessions(&write.value), Some(BTreeSet::from([2])));
        l.written(&write);
        assert!(!l.unwritten());
        // Ended with keys in flight, then ended again as if idle (a close racing its
        // replacement): the first end counts.
        assert_eq!(
            l.ended(2, t0 + 12 * SEC, false),
            None,
            "listed for the bound"
        );
        assert_eq!(l.ended(2, t0 + 12 * SEC, true), None);
        assert_eq!(listed(&mut l, t0 + 13 * SEC), BTreeSet::from([2]));
        assert!(!l.may_hand_out(4), "never opened");
        assert!(
            ListedSessions::unlimited().may_hand_out(3),
            "no Lease: no listing"
        );
    }

    #[test]
    fn past_its_bound_a_listing_says_overflow() {
        let t0 = Instant::now();
        let mut l = ListedSessions::new(SEC);
        for tag in 0..=MAX_LISTED_SESSIONS as u64 {
            l.opened(tag);
        }
        let write = l.write(t0);
        assert_eq!(parse_sessions(&write.value), None, "overflow: unknown");
        l.written(&write);
        assert!(l.may_hand_out(0), "an overflowing write lists them all");
    }

    /// Sessions that open and end in a storm are forgotten past twice the bound, oldest
    /// first, and the Lease says `overflow` until they would have ended their bound.
    #[test]
    fn a_storm_of_sessions_is_forgotten_past_its_bound_and_overflows_meanwhile() {
        let t0 = Instant::now();
        let mut l = ListedSessions::new(10 * SEC);
        for tag in 0..=(2 * MAX_LISTED_SESSIONS) as u64 {
            l.opened(tag);
            l.ended(tag, t0, false);
        }
        assert!(l.len() <= MAX_LISTED_SESSIONS + 1, "{} kept", l.len());
        assert_eq!(parse_sessions(&l.write(t0 + 9 * SEC).value), None);
        l.opened(u64::MAX);
        let write = l.write(t0 + 11 * SEC);
        assert_eq!(
            parse_sessions(&write.value),
            Some(BTreeSet::from([u64::MAX])),
            "listed again once the forgotten ones are past the bound"
        );
    }

    #[test]
    fn reports_are_carried_once_for_the_bound_and_bounded() {
        let t0 = Instant::now();
        let mut r = Relayed::default();
        assert!(r.report("d1", 7, t0));
        assert!(!r.report("d1", 7, t0 + SEC), "carried already");
        assert!(r.report("d2", 7, t0 + SEC));
        let ended = parse_ended(&r.value(t0 + 2 * SEC, 10 * SEC));
        assert_eq!(ended["d1"], BTreeSet::from([7]));
        assert_eq!(ended["d2"], BTreeSet::from([7]));
        let ended = parse_ended(&r.value(t0 + 10 * SEC, 10 * SEC));
        assert!(!ended.contains_key("d1") && ended.contains_key("d2"));
        assert_eq!(r.value(t0 + 11 * SEC, 10 * SEC), "");
        assert!(r.is_empty());
        for tag in 0..MAX_RELAYED as u64 {
            assert!(r.report("d3", tag, t0));
        }
        assert!(!r.report("d3", u64::MAX, t0), "past the bound");
        assert_eq!(r.len(), MAX_RELAYED);
    }
}
