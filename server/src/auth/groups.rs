//! A controller group as the tier keys it: its name and the user it belongs to, so one name
//! used by two users is two groups; and the groups `--group-owner` lists as shared.

use std::{collections::HashMap, sync::Arc};

/// A controller group used by a user not listed for it (`--group-owner`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "group {group:?} is listed with --group-owner for {owner}, not {caller}: run the controller as one of them, or pick another group name"
)]
pub struct NotOwner {
    /// The group.
    pub group: String,
    /// The users listed for it, joined by `or`.
    pub owner: String,
    /// The caller.
    pub caller: String,
}

/// A controller group as the tier keys it: its name and the user it belongs to. Groups are
/// scoped by identity: one name used by two users is two groups, so no user can take, join or
/// squat another's group, on any dispatcher or load balancer, before or after a restart or a
/// failover, and nothing about ownership needs remembering.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GroupId {
    /// The name every replica of the controller sends.
    pub name: String,
    /// The user the group belongs to; `None` for a group listed with `--group-owner` (shared
    /// by the users listed) and when nobody is authenticated.
    pub owner: Option<String>,
}

impl GroupId {
    /// A group nobody owns: listed with `--group-owner`, or authentication off.
    pub fn shared(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            owner: None,
        }
    }
}

impl std::fmt::Display for GroupId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.owner {
            Some(owner) => write!(f, "{} (of {owner})", self.name),
            None => f.write_str(&self.name),
        }
    }
}

/// Who may use a controller group. By default each user has groups of its own
/// ([`GroupId`]); a group an operator listed (`--group-owner GROUP=USER`, repeated) is one
/// group shared by exactly the users listed: for a controller that runs under several
/// ServiceAccounts, during a migration from one to another say.
#[derive(Clone, Debug, Default)]
pub struct GroupOwners(Arc<HashMap<String, Vec<String>>>);

impl GroupOwners {
    /// The users listed for each group, from `(group, user)` pairs.
    pub fn from_pairs(pairs: impl IntoIterator<Item = (String, String)>) -> Self {
        let mut owners: HashMap<String, Vec<String>> = HashMap::new();
        for (group, user) in pairs {
            let users = owners.entry(group).or_default();
            if !users.contains(&user) {
                users.push(user);
            }
        }
        Self(Arc::new(owners))
    }

    /// Whether no group is listed.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The group `caller` (`None`: anonymous) means by `group`: its own, unless the name is
    /// listed, and then the shared one if `caller` is listed for it.
    pub fn group_id(&self, group: &str, caller: Option<&str>) -> Result<GroupId, NotOwner> {
        if let Some(listed) = self.0.get(group) {
            return match caller {
                Some(caller) if listed.iter().any(|u| u == caller) => Ok(GroupId::shared(group)),
                _ => Err(NotOwner {
                    group: group.to_owned(),
                    owner: listed.join(" or "),
                    caller: caller.unwrap_or("anonymous").to_owned(),
                }),
            };
        }
        Ok(GroupId {
            name: group.to_owned(),
            owner: caller.map(str::to_owned),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_group_is_its_users_unless_listed() {
        let owners = GroupOwners::from_pairs([
            ("shared".to_owned(), "old-sa".to_owned()),
            ("shared".to_owned(), "new-sa".to_owned()),
        ]);
        // Unlisted: one group per user, whoever came first; authentication off: one group.
        let (a, b) = (
            owners.group_id("g", Some("a")).unwrap(),
            owners.group_id("g", Some("b")).unwrap(),
        );
        assert_ne!(a, b);
        assert_eq!(a.to_string(), "g (of a)");
        assert_eq!(owners.group_id("g", None).unwrap(), GroupId::shared("g"));
        // Listed: one group, exactly the users listed.
        for user in ["old-sa", "new-sa"] {
            assert_eq!(
                owners.group_id("shared", Some(user)).unwrap(),
                GroupId::shared("shared")
            );
        }
        let e = owners.group_id("shared", Some("other")).unwrap_err();
        assert_eq!(e.owner, "old-sa or new-sa");
        assert!(owners.group_id("shared", None).is_err());
    }
}
