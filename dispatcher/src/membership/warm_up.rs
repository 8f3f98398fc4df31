//! Joining the ring after a warm-up (`HANDOVER.md`, "Joining: make before break").
//!
//! A dispatcher that starts with no Lease of its own (a new member, or one whose previous
//! process drained) writes its Lease marked `warming`
//! ([`kube_dispatch_proto::lease::WARMING_ANNOTATION`]). The others do not count it a member
//! yet and keep serving the keys that will move to it, while the load balancer places
//! replicas on it as on any dispatcher: their sessions make its controller groups, and each
//! group's watches list what it will own. Once every group its peers serve has been made and
//! listed here (`crate::grpc::peer::warm_up`), or `--join-warm-up` has run out, the mark goes
//! and it joins like any member: the others release the keys that move, and it serves them from
//! what it has listed, so a join never makes a write wait for the joiner's list.

use std::collections::BTreeMap;

use tokio::{sync::watch, time::Instant};
use tokio_util::sync::CancellationToken;

/// A live peer as the warm-up sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WarmPeer {
    /// Where it serves.
    pub address: String,
    /// Its Lease lists `peer-groups` (`kube_dispatch_proto::capabilities::tier`): it can say
    /// which groups it serves. One that does not is an older dispatcher, not asked.
    pub serves_groups: bool,
}

/// The warm-up of one dispatcher process, shared by the membership loop (which writes the mark
/// and knows the peers) and the task that asks the peers and watches the groups.
#[derive(Clone, Debug)]
pub struct WarmUp {
    /// Until when it may last.
    until: Instant,
    /// The live members other than this dispatcher and where they serve, once the membership
    /// loop has judged a whole and current view of the Leases.
    peers: watch::Sender<Option<BTreeMap<String, WarmPeer>>>,
    /// Cancelled once this dispatcher may join: warmed up, out of time, or never warming.
    done: CancellationToken,
}

impl Default for WarmUp {
    /// No warm-up: the dispatcher joins at once, as with `--join-warm-up 0s`.
    fn default() -> Self {
        Self::new(std::time::Duration::ZERO)
    }
}

impl WarmUp {
    /// A warm-up that lasts at most `bound` from now; none when `bound` is zero.
    pub fn new(bound: std::time::Duration) -> Self {
        let done = CancellationToken::new();
        if bound.is_zero() {
            done.cancel();
        }
        Self {
            until: Instant::now() + bound,
            peers: watch::Sender::new(None),
            done,
        }
    }

    /// Until when it may last.
    pub fn until(&self) -> Instant {
        self.until
    }

    /// Whether this dispatcher still warms up: its Lease carries the mark.
    pub fn warming(&self) -> bool {
        !self.done.is_cancelled()
    }

    /// Ends the warm-up: this dispatcher joins at its next Lease write.
    pub fn end(&self) {
        self.done.cancel();
    }

    /// Resolves once the warm-up has ended.
    pub async fn ended(&self) {
        self.done.cancelled().await;
    }

    /// Publishes the live peers of a whole and current view of the Leases.
    pub(super) fn set_peers(&self, peers: BTreeMap<String, WarmPeer>) {
        self.peers.send_if_modified(|current| {
            let changed = current.as_ref() != Some(&peers);
            *current = Some(peers);
            changed
        });
    }

    /// Whether `peer` is live in the last whole and current view of the Leases.
    pub fn is_peer(&self, peer: &str) -> bool {
        self.peers
            .borrow()
            .as_ref()
            .is_some_and(|p| p.contains_key(peer))
    }

    /// The live peers, once known (or `None` if the warm-up ended first).
    pub async fn peers(&self) -> Option<BTreeMap<String, WarmPeer>> {
        let mut rx = self.peers.subscribe();
        tokio::select! {
            () = self.done.cancelled() => None,
            known = rx.wait_for(Option::is_some) => known.ok().and_then(|p| p.clone()),
        }
    }
}
