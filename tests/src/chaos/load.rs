//! The faults that load a dispatcher rather than break anything: a flood of connections that
//! would hold its door shut, and a reconnect storm of sessions. The replicas of the checked
//! group must go on through them: nothing lost, nothing reconciled twice at once.

use std::time::Duration;

use kube_dispatch_proto::v1::CloseSessionRequest;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::{Failure, world::World};
use crate::{
    Cluster,
    dispatcher::{TestSession, subscription},
    flood,
};

/// Loopback addresses a flood comes from (127.0.0.2 on; the replicas use 127.0.0.1).
const FLOOD_ADDRESSES: u8 = 4;
/// Per address: connections that never start their TLS handshake, and connections that finish
/// one and never speak. 256 in all: the dispatcher's whole bound of handshakes at once.
const FLOOD_STALLED: usize = 48;
const FLOOD_SILENT: usize = 16;

/// Sessions a storm opens at once on one dispatcher, each on a connection of its own: more
/// than it serves at once (`--max-opening-sessions`, 64), so some are refused with a pushback
/// and asked again after it, as the SDKs do.
const STORM_SESSIONS: usize = 150;

/// The controller group a storm's sessions open in: not the checked one, whose replicas must
/// go on as before.
const STORM_GROUP: &str = "chaos-storm";

/// Fault 19: a flood of TCP connections that never start their TLS handshake and TLS
/// connections that never speak, on dispatcher `i`, each reopened as the dispatcher closes it,
/// for `hold` (at least 3 s).
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
    let mut held = JoinSet::new();
    flood::flood(
        &mut held,
        d.addr,
        (FLOOD_ADDRESSES, FLOOD_STALLED, FLOOD_SILENT),
        &tls,
        &stop,
    );
    tokio::time::sleep(hold.max(Duration::from_secs(3))).await;
    stop.cancel();
    while held.join_next().await.is_some() {}
    let connections = usize::from(FLOOD_ADDRESSES) * (FLOOD_STALLED + FLOOD_SILENT);
    Ok(format!(
        "handshake-flood dispatcher-{i} ({connections} stalled and silent connections from {FLOOD_ADDRESSES} addresses)"
    ))
}

/// Fault 20: a reconnect storm on dispatcher `i`: [`STORM_SESSIONS`] sessions of a group of
/// their own, subscribed to the first namespace's ConfigMaps, opened at once, each asked again
/// after the dispatcher's pushback when refused, held for `hold`, then closed.
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
            loop {
                let open = TestSession::open_with(
                    client.clone(),
                    STORM_GROUP,
                    &format!("storm-{n}"),
                    subscriptions.clone(),
                )
                .await;
                match open {
                    Ok(session) => return (Some(session), refused),
                    Err(status) if tokio::time::Instant::now() < give_up => {
                        refused += 1;
                        let wait = kube_dispatch_proto::pushback_of(&status)
                            .unwrap_or(Duration::from_millis(200));
                        tokio::time::sleep(wait).await;
                    }
                    Err(_) => return (None, refused),
                }
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
    for mut session in sessions {
        let request = CloseSessionRequest {
            session_id: session.id.clone(),
        };
        // A dispatcher that went meanwhile closed them all.
        let _ = session.client.close_session(request).await;
    }
    Ok(format!(
        "reconnect-storm dispatcher-{i} ({opened} sessions opened at once, {refusals} refusals asked again, {unopened} not opened within 20 s; connected in {connected:.1?}, opened in {all_open:.1?})"
    ))
}
