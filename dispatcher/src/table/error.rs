//! Why a session call is refused. Each message tells the caller what to do.

use std::time::Duration;

use kube_dispatch_server::auth::NotOwner;

use crate::watch::registry::WatchError;

/// Why a session call was refused. Each message tells the caller what to do.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// The dispatcher is draining and opens no session.
    #[error("the dispatcher is draining: open the session on another dispatcher or retry")]
    Draining,
    /// The dispatcher holds the most sessions allowed (`--max-sessions`).
    #[error("dispatcher {identity} already holds {max} sessions, the most allowed")]
    TooManySessions {
        /// This dispatcher.
        identity: String,
        /// The limit.
        max: usize,
    },
    /// The group holds the most sessions allowed here (`--max-sessions-per-group`).
    #[error("group {group:?} already has {max} sessions on this dispatcher, the most allowed")]
    TooManyGroupSessions {
        /// The group.
        group: String,
        /// The limit.
        max: usize,
    },
    /// The dispatcher holds as many groups as sessions are allowed (idle ones included).
    #[error(
        "dispatcher {identity} already holds {count} controller groups (idle ones are kept for {grace:?}), the most allowed"
    )]
    TooManyGroups {
        /// This dispatcher.
        identity: String,
        /// Groups held.
        count: usize,
        /// How long an idle group is kept.
        grace: Duration,
    },
    /// One identity holds the most sessions or groups it may hold here
    /// (`--max-sessions-per-identity`, `--max-groups-per-identity`).
    #[error(
        "{user} already holds {max} {what} on dispatcher {identity}, the most one identity may hold"
    )]
    TooManyOfIdentity {
        /// The caller.
        user: String,
        /// `sessions` or `controller groups (idle ones included)`.
        what: &'static str,
        /// The limit.
        max: usize,
        /// This dispatcher.
        identity: String,
    },
    /// Another replica of the group subscribed to something else.
    #[error(
        "group {group:?} has live sessions with different subscriptions: every replica of a group must send the same subscriptions (or use another group name)"
    )]
    SubscriptionsDiffer {
        /// The group.
        group: String,
    },
    /// A watch the group needs could not be started.
    #[error(transparent)]
    Watch(#[from] WatchError),
    /// The session is not (or no longer) known here.
    #[error(
        "session {session:?} is unknown or expired on dispatcher {identity}: open a new session"
    )]
    Unknown {
        /// The session id given.
        session: String,
        /// This dispatcher.
        identity: String,
    },
    /// The replica opened a newer session, which replaced this one.
    #[error(
        "session {session:?} was replaced by a newer session of its replica: use that one or open a new session"
    )]
    Replaced {
        /// The session id given.
        session: String,
    },
    /// New subscriptions for a group whose last session ended with deliveries in flight.
    #[error(
        "group {group:?} still has deliveries in flight from a session that ended without acknowledging them: its subscriptions can change once they settle (within that session's ttl); retry then"
    )]
    HeldInFlight {
        /// The group.
        group: String,
    },
    /// The session expired or was replaced while its poll waited.
    #[error("session {session:?} ended while polling: open a new session")]
    EndedWhilePolling {
        /// The session id given.
        session: String,
    },
    /// A close of a session that is not open.
    #[error("session {session:?} is unknown or already closed")]
    NotOpen {
        /// The session id given.
        session: String,
    },
    /// The group is listed with `--group-owner` for other users
    /// (`proto/kubedispatch/v1/security.md`).
    #[error(transparent)]
    NotOwner(#[from] NotOwner),
    /// In a group shared by several users (`--group-owner`), a replica id whose live session
    /// another user opened.
    #[error(
        "replica {replica:?} of group {group:?} has a live session opened by {holder}, not {caller}: give each replica an id of its own"
    )]
    ReplicaOfAnother {
        /// The group.
        group: String,
        /// The replica id.
        replica: String,
        /// The user whose session holds it.
        holder: String,
        /// The caller.
        caller: String,
    },
    /// The session was opened by another identity.
    #[error("session {session:?} was not opened by {caller}")]
    NotYours {
        /// The session id given.
        session: String,
        /// The caller.
        caller: String,
    },
}
