//! The faults that load a dispatcher rather than break anything: a flood of connections that
//! would hold its door shut, a reconnect storm of sessions, and a join while the API server
//! refuses the joiner's lists. The replicas of the checked
//! group must go on through them: nothing lost, nothing reconciled twice at once.

use std::time::Duration;

use kube_dispatch_proto::v1::CloseSessionRequest;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::{Failure, world::World};
use crate::{
    Cluster,
    apf::RefusedLists,
    dispatcher::{TestSession, subscription},
    flood,
};

/// Loopback addresses a flood comes from (127.0.0.2 on; the replicas use 127.0.0.1): more
/// than the dispatcher's bound of handshakes at once (256) divided by its bound per address
/// (8), so the flood fills the whole bound, not only its places for those addresses.
const FLOOD_ADDRESSES: u8 = 40;
/// Per address: connections that never start their TLS handshake, and connections that finish
/// one and never speak. 320 in all.
const FLOOD_STALLED: usize = 6;
const FLOOD_SILENT: usize = 2;

/// How long one call of the storm may take: a dispatcher that stops answering (killed by no
/// other fault, since faults come one at a time, but wedged) does not hold the run.
const STORM_CALL: Duration = Duration::from_secs(5);

/// Sessions a storm opens at once on one dispatcher, each on a connection of its own: more
/// than it serves at once (`--max-opening-sessions`, 64), so some are refused with a pushback
/// and asked again after it, as the SDKs do.
const STORM_SESSIONS: usize = 150;

/// Refusals installed so far in this process: each gets a name of its own, so one whose removal
/// failed cannot make the next fail to install.
static REFUSALS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The controller group a storm's sessions open in: not the checked one, whose replicas must
/// go on as before.
const STORM_GROUP: &str = "chaos-storm";

/// Fault 19: a flood of TCP connections that never start their TLS handshake and TLS
/// connections that never speak, on dispatcher `i`, from [`FLOOD_ADDRESSES`] addresses, each
/// reopened as the dispatcher closes it, for `hold` (at least 3 s).
pub(super) async fn handshake_flood(
    world: &World,
    i: usize,
    hold: Duration,
) -> Result<String, Failure> {
    let Some(d) = world.dispatchers.get(&i).and_then(|s| s.running.as_ref()) else {
        return Ok(format!("handshake-flood dispatcher-{i} (not running)"));
    };
    let tls = flood::tls_connector(&Cluster::shared().dir().join("pki/ca.crt"))
        .map_err(|e| e.to_string())?;
    let stop = CancellationToken::new();
    let held = tokio::spawn(flood::flood(
        d.addr,
        (FLOOD_ADDRESSES, FLOOD_STALLED, FLOOD_SILENT),
        tls,
        stop.clone(),
    ));
    tokio::time::sleep(hold.max(Duration::from_secs(3))).await;
    stop.cancel();
    held.await
        .map_err(|e| format!("the flood's holders: {e}"))?;
    let connections = usize::from(FLOOD_ADDRESSES) * (FLOOD_STALLED + FLOOD_SILENT);
    Ok(format!(
        "handshake-flood dispatcher-{i} ({connections} stalled and silent connections from {FLOOD_ADDRESSES} addresses)"
    ))
}

/// Fault 20: a reconnect storm on dispatcher `i`: [`STORM_SESSIONS`] sessions of a group of
/// their own, subscribed to the first namespace's ConfigMaps, opened at once, each asked again
/// after the dispatcher's pushback when refused, then closed after `hold` (never polled, those
/// opened first may have expired by then).
pub(super) async fn reconnect_storm(
    world: &World,
    i: usize,
    hold: Duration,
) -> Result<String, Failure> {
    let Some(d) = world.dispatchers.get(&i).and_then(|s| s.running.as_ref()) else {
        return Ok(format!("reconnect-storm dispatcher-{i} (not running)"));
    };
    let subscriptions = vec![subscription("v1", "ConfigMap", world.namespaces[0].name())];
    // Connected first, then opened all at once: past the opens the dispatcher serves at once.
    let began = tokio::time::Instant::now();
    let mut clients = Vec::with_capacity(STORM_SESSIONS);
    for _ in 0..STORM_SESSIONS {
        clients.push(d.client().await);
    }
    let connected = began.elapsed();
    let give_up = tokio::time::Instant::now() + Duration::from_secs(20);
    let mut opening = JoinSet::new();
    for (n, client) in clients.into_iter().enumerate() {
        let subscriptions = subscriptions.clone();
        opening.spawn(async move {
            let mut refused = 0u32;
            let replica = format!("storm-{n}");
            loop {
                let open = TestSession::open_with(
                    client.clone(),
                    STORM_GROUP,
                    &replica,
                    subscriptions.clone(),
                );
                let status = match tokio::time::timeout(STORM_CALL, open).await {
                    Ok(Ok(session)) => return (Some(session), refused),
                    Ok(Err(status)) => status,
                    Err(_) => return (None, refused),
                };
                // Refused for now (the opens served at once, or a dispatcher starting): asked
                // again after the pushback, as the SDKs do; anything else ends this one.
                let again = matches!(
                    status.code(),
                    tonic::Code::ResourceExhausted | tonic::Code::Unavailable
                );
                if !again || tokio::time::Instant::now() >= give_up {
                    return (None, refused);
                }
                refused += 1;
                let wait =
                    kube_dispatch_proto::pushback_of(&status).unwrap_or(Duration::from_millis(200));
                tokio::time::sleep(wait).await;
            }
        });
    }
    let (mut sessions, mut refusals, mut unopened) = (Vec::new(), 0, 0);
    while let Some(opened) = opening.join_next().await {
        let (session, refused) = opened?;
        refusals += refused;
        match session {
            Some(session) => sessions.push(session),
            None => unopened += 1,
        }
    }
    let all_open = began.elapsed() - connected;
    tokio::time::sleep(hold).await;
    let opened = sessions.len();
    let mut closing = JoinSet::new();
    for mut session in sessions {
        closing.spawn(async move {
            let request = CloseSessionRequest {
                session_id: session.id.clone(),
                ..Default::default()
            };
            // Unpolled, a session may have expired already; one left open expires in its ttl.
            let _ = tokio::time::timeout(STORM_CALL, session.client.close_session(request)).await;
        });
    }
    while closing.join_next().await.is_some() {}
    Ok(format!(
        "reconnect-storm dispatcher-{i} ({opened} sessions opened at once, {refusals} refusals asked again, {unopened} not opened within 20 s; connected in {connected:.1?}, opened in {all_open:.1?})"
    ))
}

/// Fault 21: a dispatcher joins while the API server refuses its identity's lists: the fourth
/// (stopped first if it runs) starts as the test identity, whose LISTs and WATCHes (a watch
/// that sends its initial events is today's list) of ConfigMaps and Widgets, in a namespace
/// or across them (the dispatchers watch by label across namespaces), priority and fairness
/// refuses with 429
/// ([`crate::apf::RefusedLists`], in force before it starts) for `hold` (at least 3 s), as it
/// refuses a tier's lists under pressure. It warms up before it joins, so the others keep serving what moves to it until it
/// has listed; then its lists go through, and it is started again as the others are.
pub(super) async fn join_under_apf(world: &mut World, hold: Duration) -> Result<String, Failure> {
    if let Some(d) = world.dispatchers.get_mut(&3).and_then(|s| s.running.take()) {
        d.stop().await;
    }
    let token = crate::identity::tester_api_token(&world.namespaces[0].client())
        .await
        .map_err(|e| e.to_string())?;
    let namespaces: Vec<&str> = world.namespaces.iter().map(|n| n.name()).collect();
    let subject = serde_json::json!({ "kind": "ServiceAccount", "serviceAccount": {
        "name": "tester", "namespace": "kube-dispatch-tests" } });
    let rules = serde_json::json!([
        { "verbs": ["list", "watch"], "apiGroups": [""], "resources": ["configmaps"], "namespaces": ["*"], "clusterScope": true },
        { "verbs": ["list", "watch"], "apiGroups": ["test.kube-dispatch.dev"], "resources": ["widgets"], "namespaces": ["*"], "clusterScope": true },
    ]);
    let refusal = RefusedLists::install(
        world.namespaces[0].client(),
        &format!(
            "kube-dispatch-chaos-refuse-{}-{}",
            world.namespaces[0].name(),
            REFUSALS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ),
        (subject, rules),
        &token,
        format!(
            "/api/v1/namespaces/{}/configmaps?resourceVersion=4000000000&resourceVersionMatch=NotOlderThan",
            namespaces[0]
        ),
    )
    .await
    .map_err(|e| e.to_string())?;
    let probe = format!("/api/v1/namespaces/{}/configmaps?limit=1", namespaces[0]);
    let in_force = refusal
        .in_force(&token, &probe, Duration::from_secs(15))
        .await;
    let began = tokio::time::Instant::now();
    let started = world.start_dispatcher_as(3, Some(token)).await;
    tokio::time::sleep(hold.max(Duration::from_secs(3))).await;
    let refused_for = began.elapsed();
    let refused = refusal.refused().await;
    refusal.remove().await.map_err(|e| e.to_string())?;
    started?;
    // Started again as the others are (through its proxy, as the admin): the identity's token
    // lasts ten minutes, and a long run must not see it fence itself when that runs out.
    if let Some(d) = world.dispatchers.get_mut(&3).and_then(|s| s.running.take()) {
        d.stop().await;
    }
    world.start_dispatcher(3).await?;
    let refusing = if in_force {
        "refused"
    } else {
        "not yet refused"
    };
    Ok(format!(
        "join-under-apf dispatcher-3 (its identity's lists and watches {refusing} for {refused_for:.1?}: {refused} refused)"
    ))
}
