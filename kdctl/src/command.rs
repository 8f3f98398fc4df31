//! kdctl's commands: each asks the dispatchers through the operator API
//! (`proto/kubedispatch/v1/operator.proto`) and returns a view ([`crate::view`]).

use std::{
    future::ready,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use kube::discovery::{Discovery, Scope};
use kube_dispatch_proto::{
    RequestKey,
    v1::{
        DispatcherState, DrainRequest, KeyRequest, KeyResponse, KeyState, ReconcileKeyRequest,
        StatusRequest, StatusResponse, UndrainRequest,
    },
};

use crate::{
    connect::{Connection, Member},
    view::{
        DispatcherView, DrainView, GroupView, KeyAnswer, KeyPlace, OwnerView, PlacementView,
        StatusView, UndrainView, VersionView,
    },
};

/// How often a drain or an undrain looks at the members while it waits for them to settle.
const SETTLE_POLL: Duration = Duration::from_millis(250);

/// `kdctl version`: kdctl's version and each dispatcher's; more than one version among the
/// dispatchers (a rolling update under way, or stopped halfway) is a problem to show.
pub async fn version(connection: &Connection) -> anyhow::Result<VersionView> {
    let status = status(connection).await?;
    let mut versions: Vec<String> = status
        .dispatchers
        .iter()
        .filter(|d| d.error.is_none())
        .map(|d| {
            if d.version.is_empty() {
                "before 0.1.0".to_owned()
            } else {
                d.version.clone()
            }
        })
        .collect();
    versions.sort();
    versions.dedup();
    let mut problems: Vec<String> = status
        .dispatchers
        .iter()
        .filter_map(|d| {
            d.error
                .as_ref()
                .map(|e| format!("{} ({}) did not answer: {e}", d.name, d.address))
        })
        .collect();
    if versions.len() > 1 {
        problems.push(format!(
            "the dispatchers run {} versions ({}): a rolling update under way, or stopped halfway",
            versions.len(),
            versions.join(", ")
        ));
    }
    Ok(VersionView {
        kdctl: kube_dispatch_telemetry::version().to_owned(),
        dispatchers: status.dispatchers,
        versions,
        problems,
    })
}

/// `kdctl status`: asks every dispatcher at once.
pub async fn status(connection: &Connection) -> anyhow::Result<StatusView> {
    let members = connection.members().await?;
    let answers = ask_all(connection, &members, |mut operator| async move {
        Ok(operator.status(StatusRequest {}).await?.into_inner())
    })
    .await;
    let mut view = StatusView {
        dispatchers: Vec::new(),
        groups: Vec::new(),
        placements: Vec::new(),
        healthy: true,
        problems: Vec::new(),
    };
    let mut rings = std::collections::BTreeSet::new();
    for (member, answer) in members.iter().zip(answers) {
        let status = match answer {
            Ok(status) => status,
            Err(e) => {
                view.problems.push(format!(
                    "{} ({}) did not answer: {e:#}",
                    member.name, member.address
                ));
                view.dispatchers.push(DispatcherView {
                    name: member.name.clone(),
                    address: member.address.clone(),
                    state: "unreachable".into(),
                    version: String::new(),
                    error: Some(format!("{e:#}")),
                    members: Vec::new(),
                    settled_members: Vec::new(),
                    slice_share: 0.0,
                    groups: 0,
                    sessions: 0,
                    keys: 0,
                    ready: 0,
                    in_flight: 0,
                    delayed: 0,
                });
                continue;
            }
        };
        let state = state_name(status.state());
        if status.state() != DispatcherState::Serving {
            view.problems.push(format!(
                "{} is {state}{}",
                member.name,
                if status.state() == DispatcherState::Handover {
                    ": keys that moved there are held until the others release them"
                } else {
                    ""
                }
            ));
        }
        if status.state() != DispatcherState::Drained {
            rings.insert(status.members.clone());
        }
        view.dispatchers
            .push(dispatcher_view(member, &status, state));
        view.groups
            .extend(status.groups.into_iter().map(|g| GroupView {
                group: group_label(g.group, &g.owner),
                dispatcher: member.name.clone(),
                replicas: g.replicas,
                keys: g.keys,
                ready: g.ready,
                in_flight: g.in_flight,
                delayed: g.delayed,
                backing_off: g.backing_off,
                held_deletions: g.held_deletions,
                longest_in_flight_seconds: g.longest_in_flight.map_or(0.0, seconds),
            }));
    }
    if rings.len() > 1 {
        view.problems.push(format!(
            "the dispatchers see different rings ({}): a membership change is under way",
            rings
                .iter()
                .map(|r| format!("[{}]", r.join(", ")))
                .collect::<Vec<_>>()
                .join(" and ")
        ));
    }
    view.groups
        .sort_by(|a, b| (&a.group, &a.dispatcher).cmp(&(&b.group, &b.dispatcher)));
    view.placements = PlacementView::of(&view.groups);
    view.healthy = view.problems.is_empty();
    Ok(view)
}

fn dispatcher_view(member: &Member, status: &StatusResponse, state: &str) -> DispatcherView {
    let sum = |f: fn(&kube_dispatch_proto::v1::GroupStatus) -> u64| {
        status.groups.iter().map(f).sum::<u64>()
    };
    DispatcherView {
        name: status.dispatcher_id.clone(),
        address: member.address.clone(),
        state: state.to_owned(),
        version: status.version.clone(),
        error: None,
        members: status.members.clone(),
        settled_members: status.settled_members.clone(),
        slice_share: status.slice_share,
        groups: status.groups.len(),
        sessions: sum(|g| u64::from(g.sessions)),
        keys: sum(|g| g.keys),
        ready: sum(|g| g.ready),
        in_flight: sum(|g| g.in_flight),
        delayed: sum(|g| g.delayed),
    }
}

/// A group as `kdctl` shows it: its name, and the user it belongs to when it has one (groups
/// are scoped by identity, so two users' groups may share a name).
fn group_label(name: String, owner: &str) -> String {
    if owner.is_empty() {
        name
    } else {
        format!("{name} (of {owner})")
    }
}

/// The request key of `name` (`namespace/name`, or `name` for a cluster-scoped kind) of the
/// kind `resource` names, found by discovery: a kind (`ConfigMap`), a plural (`configmaps`),
/// or either with its group (`deployments.apps`, `Deployment.apps`), any case.
pub async fn request_key(
    connection: &Connection,
    resource: &str,
    name: &str,
) -> anyhow::Result<RequestKey> {
    let (wanted, group) = match resource.split_once('.') {
        Some((r, g)) => (r.to_ascii_lowercase(), Some(g.to_ascii_lowercase())),
        None => (resource.to_ascii_lowercase(), None),
    };
    let discovery = Discovery::new(connection.client().clone())
        .run()
        .await
        .context("API discovery failed")?;
    let mut found = Vec::new();
    for api_group in discovery.groups() {
        if group.as_ref().is_some_and(|g| *g != api_group.name()) {
            continue;
        }
        for (ar, caps) in api_group.recommended_resources() {
            if ar.kind.to_ascii_lowercase() == wanted || ar.plural == wanted {
                found.push((ar, caps));
            }
        }
    }
    let (ar, caps) = match found.len() {
        0 => bail!(
            "the API server serves no resource {resource:?} (a kind or plural, optionally with .group)"
        ),
        1 => found.remove(0),
        _ => bail!(
            "{resource:?} names several resources ({}): add the group, as in {}.{}",
            found
                .iter()
                .map(|(ar, _)| format!("{}.{}", ar.plural, ar.group))
                .collect::<Vec<_>>()
                .join(", "),
            found[0].0.plural,
            found[0].0.group
        ),
    };
    let (namespace, object) = match (name.split_once('/'), &caps.scope) {
        (Some((ns, n)), Scope::Namespaced) if !ns.is_empty() && !n.is_empty() => (ns, n),
        (None, Scope::Cluster) if !name.is_empty() => ("", name),
        (_, Scope::Namespaced) => bail!("{} is namespaced: give <namespace>/<name>", ar.kind),
        (_, Scope::Cluster) => bail!("{} is cluster-scoped: give <name> alone", ar.kind),
    };
    Ok(RequestKey::new(&ar.group, &ar.kind, namespace, object))
}

/// `kdctl owner`: asks every dispatcher where `key` stands.
pub async fn owner(connection: &Connection, key: &RequestKey) -> anyhow::Result<OwnerView> {
    let members = connection.members().await?;
    let text = key.to_string();
    let answers = ask_all(connection, &members, |mut operator| {
        let key = text.clone();
        async move { Ok(operator.key(KeyRequest { key }).await?.into_inner()) }
    })
    .await;
    Ok(owner_view(text, &members, answers))
}

/// `kdctl reconcile`: asks every dispatcher to reconcile `key`; the one that serves it queues
/// it in each of its groups that knows it (reason TRIGGERED), the others only say where it
/// stands. The answer is where it stands then, as `kdctl owner` shows it.
pub async fn reconcile(connection: &Connection, key: &RequestKey) -> anyhow::Result<OwnerView> {
    let members = connection.members().await?;
    let text = key.to_string();
    let answers = ask_all(connection, &members, |mut operator| {
        let key = text.clone();
        async move {
            Ok(operator
                .reconcile(ReconcileKeyRequest { key })
                .await?
                .into_inner())
        }
    })
    .await;
    Ok(owner_view(text, &members, answers))
}

/// What the dispatchers `members` answered of the key `text`.
fn owner_view(
    text: String,
    members: &[Member],
    answers: Vec<anyhow::Result<KeyResponse>>,
) -> OwnerView {
    let mut view = OwnerView {
        key: text.clone(),
        owner: String::new(),
        answers: Vec::new(),
        places: Vec::new(),
    };
    let mut owners = std::collections::BTreeSet::new();
    for (member, answer) in members.iter().zip(answers) {
        match answer {
            Ok(answer) => {
                let state = state_name(answer.state()).to_owned();
                owners.insert(answer.ring_owner.clone());
                for g in answer.groups {
                    view.places.push(KeyPlace {
                        dispatcher: answer.dispatcher_id.clone(),
                        state: key_state_name(g.state()).to_owned(),
                        group: group_label(g.group, &g.owner),
                        replica: g.replica,
                        wait_seconds: g.wait.map(seconds),
                        failures: g.failures,
                        changed_in_flight: g.changed_in_flight,
                        leaving: g.leaving,
                        deleted: g.deleted,
                        resource_version: g.resource_version,
                    });
                }
                view.answers.push(KeyAnswer {
                    state,
                    dispatcher: answer.dispatcher_id,
                    ring_owner: answer.ring_owner,
                    served: answer.served,
                    error: None,
                });
            }
            Err(e) => view.answers.push(KeyAnswer {
                dispatcher: member.name.clone(),
                ring_owner: String::new(),
                served: false,
                state: "unreachable".to_owned(),
                error: Some(format!("{e:#}")),
            }),
        }
    }
    if owners.len() == 1 {
        view.owner = owners.pop_first().unwrap_or_default();
    }
    view
}

/// `kdctl drain`: drains `name`, then waits until every other member serves a ring without
/// it, for at most `timeout`.
pub async fn drain(
    connection: &Connection,
    name: &str,
    timeout: Duration,
) -> anyhow::Result<DrainView> {
    let began = Instant::now();
    let members = connection.members().await?;
    let Some(target) = members.iter().find(|m| m.name == name) else {
        bail!(
            "no dispatcher {name:?} among {}: name one of them",
            members
                .iter()
                .map(|m| m.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
    };
    let mut operator = connection.operator(target)?;
    let mut request = tonic::Request::new(DrainRequest {});
    request.set_timeout(timeout);
    let drained = operator
        .drain(request)
        .await
        .with_context(|| format!("draining {name} failed"))?
        .into_inner();
    let mut view = DrainView {
        dispatcher: drained.dispatcher_id,
        clean: drained.clean,
        in_flight_left: drained.in_flight_left,
        drain_seconds: drained.took.map_or(0.0, seconds),
        settled_seconds: None,
        ring: Vec::new(),
        problems: Vec::new(),
    };
    if !view.clean {
        view.problems.push(format!(
            "{} deliveries were still in flight when the drain timed out",
            view.in_flight_left
        ));
    }
    // The others settle once they have seen its Lease go (or expire) and taken its keys over.
    let others: Vec<Member> = members.into_iter().filter(|m| m.name != name).collect();
    if others.is_empty() {
        view.problems
            .push("no other dispatcher is left to serve its keys".to_owned());
        return Ok(view);
    }
    let left = timeout.saturating_sub(began.elapsed());
    let without = |ring: &[String]| !ring.iter().any(|m| m == name);
    match settled(connection, || ready(others.clone()), without, began, left).await {
        Some((after, ring)) => {
            view.settled_seconds = Some(after);
            view.ring = ring;
        }
        None => view.problems.push(format!(
            "the other dispatchers had not all settled on a ring without {name} within {}",
            humantime::format_duration(timeout)
        )),
    }
    Ok(view)
}

/// `kdctl undrain DISPATCHER`: brings a drained dispatcher back into the ring without a
/// restart, then waits (up to `timeout`) until every dispatcher, it included, serves one ring
/// with it. A dispatcher drained cleanly has no Lease: it is found by its pod (or named with
/// --dispatcher).
pub async fn undrain(
    connection: &Connection,
    name: &str,
    timeout: Duration,
) -> anyhow::Result<UndrainView> {
    let began = Instant::now();
    let target = match connection.members().await {
        Ok(members) => match members.into_iter().find(|m| m.name == name) {
            Some(member) => member,
            None if connection.names_dispatchers() => bail!(
                "no dispatcher {name:?} among those given with --dispatcher: name it as {name}=ADDRESS"
            ),
            // No Lease names it (a clean drain deletes it): its pod says where it is.
            None => connection.pod_member(name).await?,
        },
        // No Lease at all, or none readable: its pod may still say where it is.
        Err(leases) => connection
            .pod_member(name)
            .await
            .with_context(|| format!("{leases:#}"))?,
    };
    let mut request = tonic::Request::new(UndrainRequest {});
    request.set_timeout(timeout);
    let answer = connection
        .operator(&target)?
        .undrain(request)
        .await
        .with_context(|| format!("undraining {name} failed"))?
        .into_inner();
    let mut view = UndrainView {
        dispatcher: answer.dispatcher_id,
        rejoining: answer.rejoining,
        holds_for_previous: answer.holds_for_previous,
        settled_seconds: None,
        ring: Vec::new(),
        problems: Vec::new(),
    };
    if !view.rejoining {
        return Ok(view);
    }
    // Its Lease is written again as it rejoins: every member, it included, as the Leases
    // name them at each look.
    let members = || {
        let target = target.clone();
        async move {
            let mut members = connection.members().await.unwrap_or_default();
            if !members.iter().any(|m| m.name == target.name) {
                members.push(target);
            }
            members
        }
    };
    let with = |ring: &[String]| ring.iter().any(|m| m == name);
    let left = timeout.saturating_sub(began.elapsed());
    match settled(connection, members, with, began, left).await {
        Some((after, ring)) => {
            view.settled_seconds = Some(after);
            view.ring = ring;
        }
        None => view.problems.push(format!(
            "the dispatchers had not all settled on a ring with {name} within {}",
            humantime::format_duration(timeout)
        )),
    }
    Ok(view)
}

/// Asks the dispatchers `members` gives (read again at each look) until each is serving and
/// all see the same ring, one `wanted` accepts: the seconds since `began` and that ring, or
/// None once `within` has passed (from now).
async fn settled<Fut: Future<Output = Vec<Member>>>(
    connection: &Connection,
    members: impl Fn() -> Fut,
    wanted: impl Fn(&[String]) -> bool,
    began: Instant,
    within: Duration,
) -> Option<(f64, Vec<String>)> {
    let asked = Instant::now();
    loop {
        let members = members().await;
        let answers = ask_all(connection, &members, |mut operator| async move {
            Ok(operator.status(StatusRequest {}).await?.into_inner())
        })
        .await;
        let rings: Option<Vec<Vec<String>>> = answers
            .iter()
            .map(|a| {
                let s = a.as_ref().ok()?;
                (s.state() == DispatcherState::Serving && wanted(&s.members))
                    .then(|| s.members.clone())
            })
            .collect();
        if let Some(rings) = rings
            && rings.windows(2).all(|w| w[0] == w[1])
        {
            return Some((
                began.elapsed().as_secs_f64(),
                rings.into_iter().next().unwrap_or_default(),
            ));
        }
        if asked.elapsed() >= within {
            return None;
        }
        tokio::time::sleep(SETTLE_POLL).await;
    }
}

/// Runs `call` on every member at once, each within the connection's timeout.
async fn ask_all<T, F, Fut>(
    connection: &Connection,
    members: &[Member],
    call: F,
) -> Vec<anyhow::Result<T>>
where
    F: Fn(crate::connect::Operator) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<T>>,
{
    let timeout = connection.timeout();
    let calls = members.iter().map(|member| {
        let operator = connection.operator(member);
        let call = &call;
        async move {
            let operator = operator?;
            tokio::time::timeout(timeout, call(operator))
                .await
                .map_err(|_| anyhow::anyhow!("no answer within {timeout:?}"))?
        }
    });
    futures::future::join_all(calls).await
}

fn seconds(d: prost_types::Duration) -> f64 {
    d.seconds as f64 + f64::from(d.nanos) / 1e9
}

fn state_name(state: DispatcherState) -> &'static str {
    match state {
        DispatcherState::Serving => "serving",
        DispatcherState::Handover => "handover",
        DispatcherState::Draining => "draining",
        DispatcherState::Drained => "drained",
        DispatcherState::Unspecified => "unknown",
    }
}

fn key_state_name(state: KeyState) -> &'static str {
    match state {
        KeyState::Idle => "idle",
        KeyState::Queued => "queued",
        KeyState::InFlight => "in-flight",
        KeyState::BackingOff => "backing-off",
        KeyState::RequeueAfter => "requeue-after",
        KeyState::Unspecified => "unknown",
    }
}
