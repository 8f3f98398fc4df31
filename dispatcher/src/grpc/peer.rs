//! The dispatcher-to-dispatcher API (`proto/kubedispatch/v1/peer.proto`): a dispatcher that
//! starts serving a controller group asks its live peers for the deletions they remember of
//! keys it owns (`kube_dispatch_core::recent_deletions`), so a deletion made while it was down,
//! or before the group existed on it, is still delivered (`HANDOVER.md`, "Deletions in
//! transit"). A dispatcher warming up to join asks its peers which groups they serve, and
//! joins once it has made and listed each (`crate::membership::warm_up`). Both sides of these
//! two are here: the service peers call, and the asking. A dispatcher also makes one LIST for
//! the peers that need the same (`Peer.List`), served here and asked by
//! `crate::watch::sharing`.

use std::{sync::Arc, time::Duration};

use kube_dispatch_proto::{
    Ring,
    credentials::{AuthChannel, Credentials},
    v1::{
        GroupName, GroupsRequest, GroupsResponse, ListChunk, ListRequest, RecentDeletionsRequest,
        RecentDeletionsResponse, peer_client::PeerClient, peer_server::Peer,
    },
};
use kube_dispatch_server::auth::{Caller, GroupId};
use tonic::{Request, Response, Status};
use tracing::{info, warn};

use backon::{BackoffBuilder, ExponentialBuilder};
use kube_dispatch_core::subscription::MAX_FIELD_LEN;

use crate::{
    group::Group,
    membership::warm_up::{WarmPeer, WarmUp},
    security::Guard,
    table::GroupTable,
};

/// Most ring members a request may name.
const MAX_RING_MEMBERS: usize = 1024;

/// How often a warming dispatcher looks again whether its groups have listed.
const LISTED_RECHECK: Duration = Duration::from_millis(100);

/// How long one peer may take to answer.
const PEER_TIMEOUT: Duration = Duration::from_secs(3);
/// Largest answer accepted: `--max-recent-deletions` keys of up to a few hundred bytes.
const MAX_ANSWER_BYTES: usize = 64 * 1024 * 1024;

/// The gRPC service peers call.
#[derive(Debug, Clone)]
pub struct PeerService {
    groups: Arc<GroupTable>,
    guard: Arc<Guard>,
}

impl PeerService {
    /// A service over `groups`, for the callers `guard` admits.
    pub fn new(groups: Arc<GroupTable>, guard: Arc<Guard>) -> Self {
        Self { groups, guard }
    }
}

#[tonic::async_trait]
impl Peer for PeerService {
    type ListStream =
        std::pin::Pin<Box<dyn futures::Stream<Item = Result<ListChunk, Status>> + Send + 'static>>;

    async fn list(
        &self,
        request: Request<ListRequest>,
    ) -> Result<Response<Self::ListStream>, Status> {
        self.guard.may_call_peer(&Caller::of(&request))?;
        let req = request.into_inner();
        if req.identity.len() > MAX_FIELD_LEN {
            return Err(Status::invalid_argument(format!(
                "identity must be at most {MAX_FIELD_LEN} bytes long"
            )));
        }
        let Some(sharing) = self.groups.sharing() else {
            return Err(Status::unimplemented("this dispatcher shares no list"));
        };
        let parts = sharing.serve(
            &req.identity,
            &req.path,
            req.protobuf,
            req.min_resource_version,
        )?;
        Ok(Response::new(Box::pin(parts)))
    }

    async fn recent_deletions(
        &self,
        request: Request<RecentDeletionsRequest>,
    ) -> Result<Response<RecentDeletionsResponse>, Status> {
        self.guard.may_call_peer(&Caller::of(&request))?;
        let req = request.into_inner();
        for (field, value) in [("group", &req.group), ("identity", &req.identity)] {
            if value.is_empty() || value.len() > MAX_FIELD_LEN {
                return Err(Status::invalid_argument(format!(
                    "{field} must be 1 to {MAX_FIELD_LEN} bytes long"
                )));
            }
        }
        if req.members.len() > MAX_RING_MEMBERS || !req.members.contains(&req.identity) {
            return Err(Status::invalid_argument(format!(
                "members must list at most {MAX_RING_MEMBERS} dispatchers, the identity {:?} among them",
                req.identity
            )));
        }
        if req.group_owner.len() > MAX_FIELD_LEN {
            return Err(Status::invalid_argument(format!(
                "group_owner must be at most {MAX_FIELD_LEN} bytes long"
            )));
        }
        let id = GroupId {
            name: req.group,
            owner: Some(req.group_owner).filter(|o| !o.is_empty()),
        };
        // A peer older than group owners names none: it hears from every group of that name
        // (a deletion delivered twice is harmless; one missed is lost).
        let groups = match self.groups.group(&id) {
            Some(group) => vec![group],
            None if id.owner.is_none() => self.groups.named(&id.name),
            None => Vec::new(),
        };
        // Placed the way this dispatcher places keys: a peer that places them otherwise never
        // completes a handover with it (the ring ids differ).
        let ring_key = self.groups.slices().borrow().ring.key();
        let ring = Ring::with_key(req.members, ring_key);
        let mut keys: Vec<String> = groups
            .iter()
            .flat_map(|g| g.recent_deletions_owned_by(&ring, &req.identity))
            .map(|k| k.to_string())
            .collect();
        keys.sort_unstable();
        keys.dedup();
        keys.truncate(self.groups.recent_deletions().capacity);
        Ok(Response::new(RecentDeletionsResponse { keys }))
    }

    async fn groups(
        &self,
        request: Request<GroupsRequest>,
    ) -> Result<Response<GroupsResponse>, Status> {
        self.guard.may_call_peer(&Caller::of(&request))?;
        let identity = request.into_inner().identity;
        if identity.len() > MAX_FIELD_LEN {
            return Err(Status::invalid_argument(format!(
                "identity must be at most {MAX_FIELD_LEN} bytes long"
            )));
        }
        let groups: Vec<GroupName> = self
            .groups
            .served_groups()
            .into_iter()
            .map(|id| GroupName {
                name: id.name,
                owner: id.owner.unwrap_or_default(),
            })
            .collect();
        info!(peer = %identity, groups = groups.len(), "a dispatcher warming up to join asked which groups this one serves");
        Ok(Response::new(GroupsResponse { groups }))
    }
}

/// A warm-up of at most `bound` for this dispatcher's membership loop, with its task started
/// ([`warm_up`]) until `stop`; none when `bound` is zero.
pub fn start_warm_up(
    groups: Arc<GroupTable>,
    bound: Duration,
    credentials: Credentials,
    stop: tokio_util::sync::CancellationToken,
) -> WarmUp {
    let warm = WarmUp::new(bound);
    if warm.warming() {
        tokio::spawn(warm_up(groups, warm.clone(), credentials, stop));
    }
    warm
}

/// Warms this dispatcher up to join the ring (`crate::membership::warm_up`): asks every live
/// peer which groups it serves, then waits until each of them has been made here (by a session
/// of its replicas) and has listed what it owns, and ends `warm`. A peer that cannot be reached
/// is asked again with a backoff; one older than the question (UNIMPLEMENTED) names no group.
/// When the warm-up runs out first, says which groups were not listed: writes to their keys
/// that move here wait for their lists.
pub async fn warm_up(
    groups: Arc<GroupTable>,
    warm: WarmUp,
    credentials: Credentials,
    stop: tokio_util::sync::CancellationToken,
) {
    let started = tokio::time::Instant::now();
    let ask = async {
        let peers = warm.peers().await?;
        Some(groups_of(&peers, &warm, groups.identity(), &credentials).await)
    };
    let needed = tokio::select! {
        () = stop.cancelled() => return,
        () = warm.ended() => return,
        () = tokio::time::sleep_until(warm.until()) => {
            warn!(took = ?started.elapsed(), "the warm-up ran out (--join-warm-up) before the peers said which groups they serve: joining the ring");
            warm.end();
            return;
        }
        needed = ask => match needed {
            Some(needed) => needed,
            None => return,
        },
    };
    // A watch's lists end without a word to anyone: look again and again.
    let mut recheck = tokio::time::interval(LISTED_RECHECK);
    loop {
        if needed.iter().all(|id| groups.is_listed(id)) {
            info!(
                groups = needed.len(),
                took = ?started.elapsed(),
                "warmed up: every controller group the peers serve is listed here; joining the ring"
            );
            break;
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = warm.ended() => return,
            () = tokio::time::sleep_until(warm.until()) => {
                let waiting: Vec<String> = needed
                    .iter()
                    .filter(|id| !groups.is_listed(id))
                    .map(ToString::to_string)
                    .collect();
                warn!(took = ?started.elapsed(), ?waiting, "the warm-up ran out (--join-warm-up) before every group the peers serve was made and listed here: joining the ring; writes to keys of these groups that move here wait for their replicas and lists");
                break;
            }
            _ = recheck.tick() => {}
        }
    }
    warm.end();
}

/// The groups `peers` serve, each asked until it answers (or says it cannot tell) or is no
/// longer a live peer in `warm`'s view (it stopped, or died, meanwhile). A peer whose Lease does
/// not list `peer-groups` is an older dispatcher: not asked, it names no group.
async fn groups_of(
    peers: &std::collections::BTreeMap<String, WarmPeer>,
    warm: &WarmUp,
    identity: &str,
    credentials: &Credentials,
) -> std::collections::BTreeSet<GroupId> {
    let mut needed = std::collections::BTreeSet::new();
    let (asked, older): (Vec<_>, Vec<_>) = peers.iter().partition(|(_, p)| p.serves_groups);
    if !older.is_empty() {
        let older: Vec<&String> = older.into_iter().map(|(name, _)| name).collect();
        info!(peers = ?older, "peers whose Leases do not list peer-groups (older than the warm-up) name no group: not waiting for theirs");
    }
    let peers = asked
        .into_iter()
        .map(|(name, p)| (name.clone(), p.address.clone()))
        .collect();
    let question = |address: String| {
        let request = GroupsRequest {
            identity: identity.to_owned(),
        };
        async move {
            match ask_groups(credentials, &address, request).await {
                Err(e) if e.code() == tonic::Code::Unimplemented => {
                    info!(%address, "a peer older than the warm-up names no group: joining without waiting for its groups");
                    Ok(Vec::new())
                }
                asked => asked,
            }
        }
    };
    let answered = |names: Vec<GroupName>| {
        needed.extend(names.into_iter().map(|g| GroupId {
            name: g.name,
            owner: Some(g.owner).filter(|o| !o.is_empty()),
        }));
    };
    let still = |peer: &str| warm.is_peer(peer);
    ask_each(
        peers,
        "which groups it serves",
        question,
        answered,
        still,
        None,
    )
    .await;
    needed
}

/// Once this dispatcher serves keys (its peers are known from their Leases by then), asks every
/// live peer for the deletions it remembers, in `group`, of keys this dispatcher owns, and hands
/// them to the group. A peer that cannot be reached (a network cut, a peer restarting) is asked
/// again with a backoff for as long as peers remember deletions; what a peer still unreachable
/// then remembered is missed, and logged.
pub async fn fetch_recent_deletions(
    groups: Arc<GroupTable>,
    group: Arc<Group>,
    credentials: Credentials,
) {
    let mut slices = groups.slices();
    // A group dropped before this dispatcher serves anything ends the wait: one task per live
    // group at most.
    let slice = tokio::select! {
        () = group.dropped() => return,
        served = slices.wait_for(|s| s.settled.is_some()) => match served {
            Ok(slice) => slice.clone(),
            Err(_) => return,
        },
    };
    let identity = groups.identity().to_owned();
    let members = slice.ring.members().to_vec();
    let give_up = tokio::time::Instant::now() + groups.recent_deletions().window;
    let peers = slice
        .peers
        .iter()
        .map(|(peer, address)| (peer.clone(), address.clone()))
        .collect();
    let mut fetched = 0;
    let what = format!(
        "for the deletions it remembers of this dispatcher's keys in group {}",
        group.id
    );
    let question = |address: String| {
        let request = RecentDeletionsRequest {
            group: group.id.name.clone(),
            group_owner: group.id.owner.clone().unwrap_or_default(),
            identity: identity.clone(),
            members: members.clone(),
        };
        let credentials = &credentials;
        async move { ask(credentials, &address, request).await }
    };
    let answered = |keys: Vec<String>| {
        fetched += keys.len();
        group.deleted_in_transit(keys);
    };
    let unanswered = tokio::select! {
        () = group.dropped() => return,
        left = ask_each(peers, &what, question, answered, |_| true, Some(give_up)) => left,
    };
    if !unanswered.is_empty() {
        let peers: Vec<&str> = unanswered.iter().map(|(p, _)| p.as_str()).collect();
        warn!(group = %group.id, ?peers, "peers unreachable for as long as they remember deletions: a deletion made while this group was not served here may be missed");
    }
    if fetched > 0 {
        info!(group = %group.id, deletions = fetched, "peers remembered deletions of keys this dispatcher owns: delivering them once the keys are served");
    }
}

/// Asks each of `peers` (name, address) with `ask` and hands each answer to `answered`, then
/// asks again after a backoff ([`retry_delays`]) those that did not answer and that `still`
/// keeps, until every one has answered or the next try would come at `give_up` or later;
/// returns those that never answered. Failures of the first round are logged, saying what was
/// asked.
async fn ask_each<T, Fut>(
    mut pending: Vec<(String, String)>,
    what: &str,
    ask: impl Fn(String) -> Fut,
    mut answered: impl FnMut(T),
    still: impl Fn(&str) -> bool,
    give_up: Option<tokio::time::Instant>,
) -> Vec<(String, String)>
where
    Fut: std::future::Future<Output = Result<T, Status>>,
{
    let mut delays = retry_delays();
    let mut rounds = 0;
    while !pending.is_empty() {
        let mut unanswered = Vec::new();
        for (peer, address) in pending {
            match ask(address.clone()).await {
                Ok(answer) => answered(answer),
                Err(e) => {
                    if rounds == 0 {
                        warn!(%peer, %address, error = %e, "cannot ask a peer {what}; asking again");
                    }
                    unanswered.push((peer, address));
                }
            }
        }
        pending = unanswered;
        pending.retain(|(peer, _)| still(peer));
        rounds += 1;
        if pending.is_empty() {
            break;
        }
        let delay = delays.next().unwrap_or(Duration::from_millis(2500));
        if give_up.is_some_and(|at| tokio::time::Instant::now() + delay >= at) {
            break;
        }
        tokio::time::sleep(delay).await;
    }
    pending
}

/// Waits between asks of peers that did not answer, until the caller gives up: 200 ms doubling
/// to 2.5 s, each with a random jitter of up to as much again, so at most 5 s.
fn retry_delays() -> impl Iterator<Item = Duration> {
    ExponentialBuilder::default()
        .with_jitter()
        .with_min_delay(Duration::from_millis(200))
        .with_max_delay(Duration::from_millis(2500))
        .without_max_times()
        .build()
}

/// A client of the peer at `address`, each call bounded by [`PEER_TIMEOUT`].
async fn client(
    credentials: &Credentials,
    address: &str,
) -> Result<PeerClient<AuthChannel>, Status> {
    let endpoint = credentials
        .endpoint(address)
        .map_err(|e| Status::invalid_argument(format!("bad peer address: {e}")))?
        .connect_timeout(PEER_TIMEOUT)
        .timeout(PEER_TIMEOUT);
    let channel = endpoint
        .connect()
        .await
        .map_err(|e| Status::unavailable(e.to_string()))?;
    Ok(PeerClient::with_interceptor(channel, credentials.bearer())
        .max_decoding_message_size(MAX_ANSWER_BYTES))
}

async fn ask(
    credentials: &Credentials,
    address: &str,
    request: RecentDeletionsRequest,
) -> Result<Vec<String>, Status> {
    let mut client = client(credentials, address).await?;
    Ok(client.recent_deletions(request).await?.into_inner().keys)
}

async fn ask_groups(
    credentials: &Credentials,
    address: &str,
    request: GroupsRequest,
) -> Result<Vec<GroupName>, Status> {
    let mut client = client(credentials, address).await?;
    Ok(client.groups(request).await?.into_inner().groups)
}

#[cfg(test)]
mod tests {
    use std::{
        collections::BTreeMap,
        sync::{
            Arc,
            atomic::{AtomicUsize, Ordering},
        },
        time::Duration,
    };

    use super::*;

    /// A peer whose Lease does not list `peer-groups` (a dispatcher older than the warm-up) is
    /// not asked which groups it serves: the warm-up neither dials it nor waits for it. Asked,
    /// this one (it accepts connections and never answers) would hold the warm-up until it ran
    /// out.
    #[tokio::test]
    async fn a_peer_whose_lease_lists_no_peer_groups_is_not_asked() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind loopback");
        let address = listener.local_addr().expect("address").to_string();
        let accepted = Arc::new(AtomicUsize::new(0));
        let counted = accepted.clone();
        let silent = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((connection, _)) = listener.accept().await {
                counted.fetch_add(1, Ordering::SeqCst);
                held.push(connection);
            }
        });
        let warm = WarmUp::new(Duration::from_secs(600));
        let peers = BTreeMap::from([(
            "dispatcher-old".to_owned(),
            WarmPeer {
                address,
                serves_groups: false,
            },
        )]);
        let asked = tokio::time::timeout(
            Duration::from_secs(5),
            groups_of(&peers, &warm, "dispatcher-2", &Credentials::plaintext()),
        )
        .await;
        assert_eq!(asked.ok(), Some(Default::default()), "the warm-up waited");
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            0,
            "the older peer was dialled"
        );
        silent.abort();
    }
}
