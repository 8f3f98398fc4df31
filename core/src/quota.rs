//! The rules that keep one tenant from taking a dispatcher: how many sessions and groups it may
//! hold, and how the shared body pool is shared out once it runs short. Pure: the dispatcher
//! counts what is held under its locks and asks these rules what to refuse.

use std::{collections::HashMap, hash::Hash};

/// The limits a dispatcher holds its tenants to (`--max-sessions` and the flags beside it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Quotas {
    /// Most live sessions on the dispatcher; groups (idle ones included) are bounded by it too.
    pub max_sessions: usize,
    /// Most live sessions in one group.
    pub max_sessions_per_group: usize,
    /// Most live sessions of one identity, over all its groups.
    pub max_sessions_per_identity: usize,
    /// Most groups one identity holds, idle ones included.
    pub max_groups_per_identity: usize,
}

/// A limit a new session would pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exceeded {
    /// The dispatcher's sessions.
    Sessions {
        /// The limit.
        max: usize,
    },
    /// The group's sessions.
    GroupSessions {
        /// The limit.
        max: usize,
    },
    /// The dispatcher's groups (bounded by `max_sessions`).
    Groups {
        /// How many it holds already.
        count: usize,
    },
    /// The identity's groups, idle ones included.
    IdentityGroups {
        /// The limit.
        max: usize,
    },
    /// The identity's sessions.
    IdentitySessions {
        /// The limit.
        max: usize,
    },
}

/// What one identity holds on the dispatcher.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Held {
    /// Groups it created, idle ones included.
    pub groups: usize,
    /// Live sessions in them.
    pub sessions: usize,
}

impl Quotas {
    /// Whether the dispatcher, holding `sessions`, takes one more. A replica `replacing` its
    /// own session takes no new slot, so it is never refused by a count.
    pub fn session(&self, sessions: usize, replacing: bool) -> Result<(), Exceeded> {
        if !replacing && sessions >= self.max_sessions {
            return Err(Exceeded::Sessions {
                max: self.max_sessions,
            });
        }
        Ok(())
    }

    /// Whether a group holding `sessions` takes one more (unless `replacing`).
    pub fn group_session(&self, sessions: usize, replacing: bool) -> Result<(), Exceeded> {
        if !replacing && sessions >= self.max_sessions_per_group {
            return Err(Exceeded::GroupSessions {
                max: self.max_sessions_per_group,
            });
        }
        Ok(())
    }

    /// Whether the dispatcher, holding `groups`, makes one more. Groups without sessions
    /// linger for their grace: bounded with the sessions, a client opening sessions under ever
    /// new group names cannot grow the table.
    pub fn group(&self, groups: usize) -> Result<(), Exceeded> {
        if groups >= self.max_sessions {
            return Err(Exceeded::Groups { count: groups });
        }
        Ok(())
    }

    /// Whether an identity that holds `held` takes one more session (unless `replacing` its
    /// own), and one more group when `creating` one.
    pub fn identity(&self, held: Held, creating: bool, replacing: bool) -> Result<(), Exceeded> {
        if creating && held.groups >= self.max_groups_per_identity {
            return Err(Exceeded::IdentityGroups {
                max: self.max_groups_per_identity,
            });
        }
        if !replacing && held.sessions >= self.max_sessions_per_identity {
            return Err(Exceeded::IdentitySessions {
                max: self.max_sessions_per_identity,
            });
        }
        Ok(())
    }
}

/// The share of a pool of `capacity` bytes each group gets once the pool runs short: even per
/// owner (the user a group belongs to), and an owner's share even over its groups, so no owner
/// however many groups it opens can keep the others' out. `owners` gives each group's owner, in
/// the order the shares are returned.
pub fn body_shares<O: Eq + Hash + Copy>(capacity: usize, owners: &[O]) -> Vec<usize> {
    let mut groups_of: HashMap<O, usize> = HashMap::new();
    for owner in owners {
        *groups_of.entry(*owner).or_default() += 1;
    }
    let per_owner = capacity / groups_of.len().max(1);
    owners
        .iter()
        .map(|owner| per_owner / groups_of[owner])
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const QUOTAS: Quotas = Quotas {
        max_sessions: 4,
        max_sessions_per_group: 2,
        max_sessions_per_identity: 3,
        max_groups_per_identity: 2,
    };

    #[test]
    fn a_full_dispatcher_or_group_refuses_a_new_session_but_not_a_replacing_one() {
        assert_eq!(QUOTAS.session(3, false), Ok(()));
        assert_eq!(QUOTAS.session(4, false), Err(Exceeded::Sessions { max: 4 }));
        assert_eq!(QUOTAS.session(4, true), Ok(()));
        assert_eq!(QUOTAS.group_session(1, false), Ok(()));
        assert_eq!(
            QUOTAS.group_session(2, false),
            Err(Exceeded::GroupSessions { max: 2 })
        );
        assert_eq!(QUOTAS.group_session(2, true), Ok(()));
    }

    #[test]
    fn groups_are_bounded_by_the_sessions() {
        assert_eq!(QUOTAS.group(3), Ok(()));
        assert_eq!(QUOTAS.group(4), Err(Exceeded::Groups { count: 4 }));
    }

    #[test]
    fn an_identity_is_held_to_its_groups_when_creating_and_to_its_sessions_unless_replacing() {
        let two_groups = Held {
            groups: 2,
            sessions: 1,
        };
        assert_eq!(
            QUOTAS.identity(two_groups, true, false),
            Err(Exceeded::IdentityGroups { max: 2 })
        );
        assert_eq!(QUOTAS.identity(two_groups, false, false), Ok(()));
        let three_sessions = Held {
            groups: 1,
            sessions: 3,
        };
        assert_eq!(
            QUOTAS.identity(three_sessions, false, false),
            Err(Exceeded::IdentitySessions { max: 3 })
        );
        assert_eq!(QUOTAS.identity(three_sessions, false, true), Ok(()));
    }

    #[test]
    fn bodies_are_shared_evenly_per_owner_then_per_group() {
        // Owner a has three groups, b one, nobody (authentication off) one.
        let owners = [Some("a"), Some("a"), Some("b"), Some("a"), None];
        let shares = body_shares(900, &owners);
        assert_eq!(shares, vec![100, 100, 300, 100, 300]);
        // Over its groups, no owner gets more than its even share.
        let a: usize = shares
            .iter()
            .zip(owners)
            .filter(|(_, o)| *o == Some("a"))
            .map(|(s, _)| s)
            .sum();
        assert!(a <= 900 / 3);
        assert!(body_shares::<u8>(900, &[]).is_empty());
    }
}
