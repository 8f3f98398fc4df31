//! The faults: what each kind does to the world, and the faults that need a scenario of their
//! own (owners changed in a watch gap, a controller back from what exists).

use std::{
    collections::{BTreeMap, BTreeSet},
    time::Duration,
};

use k8s_openapi::api::{coordination::v1::Lease, core::v1::ConfigMap};
use kube::{
    Api, ResourceExt,
    api::{DeleteParams, Patch, PatchParams},
};
use rand::{RngExt as _, rngs::StdRng};
use tokio::{sync::Mutex, time::Instant};

use super::{
    DISPATCHERS, FAULT_KINDS, Failure, IDLE_GRACE, REPLICAS, TTL, world::World, writer::WriterState,
};
use crate::{Cluster, Widget, faultproxy::Fault, loadbalancer::TestLoadBalancer};

/// Whether fault `what` killed the dispatcher that owns `key` (`Kind/namespace/name`) on a
/// ring of three or four members.
pub(super) fn killed_owner(what: &str, key: &str) -> bool {
    let Some(victim) = what
        .strip_prefix("kill-dispatcher ")
        .and_then(|rest| rest.split(' ').next())
    else {
        return false;
    };
    let mut parts = key.splitn(3, '/');
    let (Some(kind), Some(namespace), Some(name)) = (parts.next(), parts.next(), parts.next())
    else {
        return false;
    };
    let group = if kind == "Widget" {
        "test.kube-dispatch.dev"
    } else {
        ""
    };
    let request = kube_dispatch_proto::RequestKey::new(group, kind, namespace, name);
    [3usize, 4].iter().any(|n| {
        kube_dispatch_proto::Ring::new((0..*n).map(|i| format!("dispatcher-{i}"))).owner(&request)
            == Some(victim)
    })
}

/// Injects one fault chosen by `rng` among `kinds` (all when empty), holds it, heals it;
/// returns its description. The kinds: 0 and 1 kill -9 and restart gracefully a dispatcher,
/// 2 and 3 a replica; 4 kill -9 of the load-balancer leader; 5 dispatcher scale up or down;
/// 6 an API-server restart, 7 one past the watchers' resourceVersion (410); 8 to 10 a cut, a
/// stall and latency between controllers and a dispatcher, 11 to 13 between a dispatcher and
/// the API server (14 a cut again); 15 and 16 deletion of a live or a stalled dispatcher's
/// Lease; 17 owners changing in a watch gap; 18 every replica away past the idle grace; 19 a
/// handshake flood and 20 a reconnect storm on a dispatcher, 21 a fourth dispatcher joining
/// while its lists are refused (`super::load`).
pub(super) async fn inject(
    world: &mut World,
    state: &Mutex<WriterState>,
    kinds: &[u32],
    rng: &mut StdRng,
) -> Result<String, Failure> {
    let hold = Duration::from_millis(rng.random_range(1000..3500));
    let i = rng.random_range(0..DISPATCHERS);
    let j = rng.random_range(0..REPLICAS);
    let replica = format!("replica-{j}");
    let kind = if kinds.is_empty() {
        rng.random_range(0..FAULT_KINDS)
    } else {
        kinds[rng.random_range(0..kinds.len())]
    };
    let what = match kind {
        0 => {
            if let Some(d) = world.dispatchers.get_mut(&i).and_then(|s| s.running.take()) {
                d.kill();
            }
            tokio::time::sleep(hold).await;
            world.start_dispatcher(i).await?;
            format!("kill-dispatcher dispatcher-{i} (kill -9, restart)")
        }
        1 => {
            if let Some(d) = world.dispatchers.get_mut(&i).and_then(|s| s.running.take()) {
                d.stop().await;
            }
            world.start_dispatcher(i).await?;
            format!("restart-dispatcher dispatcher-{i} (graceful)")
        }
        2 => {
            if let Some(r) = world.replicas.get_mut(&replica).and_then(Option::take) {
                r.kill();
                world.journal.killed(&replica);
            }
            tokio::time::sleep(hold).await;
            world.start_replica(&replica)?;
            format!("kill-replica {replica} (kill -9, restart)")
        }
        3 => {
            if let Some(r) = world.replicas.get_mut(&replica).and_then(Option::take) {
                r.stop().await;
            }
            world.start_replica(&replica)?;
            format!("restart-replica {replica} (graceful)")
        }
        4 => kill_lb_leader(world, hold).await?,
        5 => {
            if let Some(d) = world.dispatchers.get_mut(&3).and_then(|s| s.running.take()) {
                d.stop().await;
                "scale-dispatchers 4 to 3".into()
            } else {
                world.start_dispatcher(3).await?;
                "scale-dispatchers 3 to 4".into()
            }
        }
        6 => {
            Cluster::shared().restart_apiserver().await?;
            "restart-apiserver".into()
        }
        7 => {
            Cluster::shared()
                .restart_apiserver_expiring_watches(&world.namespaces[0])
                .await?;
            "gone-410 (API server restart past the watchers' resourceVersion)".into()
        }
        15 | 16 => delete_lease(world, i, hold, kind == 16).await?,
        17 => owners_change_in_a_watch_gap(world, state, rng).await?,
        18 => controllers_away(world, state, rng).await?,
        19 => super::load::handshake_flood(world, i, hold).await?,
        20 => super::load::reconnect_storm(world, i, hold).await?,
        21 => super::load::join_under_apf(world, hold).await?,
        _ => network(world, i, kind, hold).await,
    };
    Ok(what)
}

/// Fault 4: the leading load balancer killed and, after `hold`, started again as a standby.
async fn kill_lb_leader(world: &mut World, hold: Duration) -> Result<String, Failure> {
    let leader = world
        .balancers
        .iter()
        .position(|b| b.as_ref().is_some_and(TestLoadBalancer::leads));
    let Some(leader) = leader else {
        return Ok("kill-lb-leader (no leader at the time: skipped)".into());
    };
    if let Some(lb) = world.balancers[leader].take() {
        lb.kill();
    }
    // The Service forwards to the live one.
    if let Some(other) = world.balancers.iter().flatten().next() {
        world.service.retarget(other.addr);
    }
    tokio::time::sleep(hold).await;
    world.start_balancer(leader).await?;
    Ok("kill-lb-leader (kill -9, restart as standby)".into())
}

/// Faults 15 and 16: someone deletes dispatcher `i`'s Lease (kubectl delete lease, a cleanup
/// job): of a live one, which writes it again at its next renewal, or of one `stalled` as on a
/// partitioned node, which comes back after `hold`.
async fn delete_lease(
    world: &mut World,
    i: usize,
    hold: Duration,
    stalled: bool,
) -> Result<String, Failure> {
    let Some(d) = world.dispatchers.get(&i).and_then(|s| s.running.as_ref()) else {
        return Ok("delete-lease (no such dispatcher: skipped)".into());
    };
    if stalled {
        // Stalled past the hold; then its pod is replaced (a process that resumes after
        // a pause longer than its Lease is a case of its own, not covered here).
        d.freeze(hold + Duration::from_secs(5));
    }
    let leases: Api<Lease> =
        Api::namespaced(Cluster::shared().client().await?, &world.lease_namespace());
    match leases
        .delete(&format!("dispatcher-{i}"), &DeleteParams::default())
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(e) => return Err(e.into()),
    }
    tokio::time::sleep(hold).await;
    Ok(if stalled {
        if let Some(d) = world.dispatchers.get_mut(&i).and_then(|s| s.running.take()) {
            d.kill();
        }
        world.start_dispatcher(i).await?;
        format!("delete-lease dispatcher-{i} (stalled, as on a partitioned node, then replaced)")
    } else {
        format!("delete-lease dispatcher-{i} (live)")
    })
}

/// Fault 18: every replica away past the idle grace: the groups are dropped, and the
/// controller comes back to what exists (CONTRACT.md, keys.md "A controller that comes back").
/// Killed replicas' sessions first live out their ttl.
async fn controllers_away(
    world: &mut World,
    state: &Mutex<WriterState>,
    rng: &mut StdRng,
) -> Result<String, Failure> {
    let kill = rng.random_bool(0.5);
    // No deletions from here until the controllers are back: which of those the
    // contract delivers depends on when each group is made again.
    state.lock().await.pause_deletions = true;
    let stopped = Instant::now();
    for (name, slot) in &mut world.replicas {
        if let Some(r) = slot.take() {
            if kill {
                r.kill();
                world.journal.killed(name);
            } else {
                r.stop().await;
            }
        }
    }
    tokio::time::sleep(TTL + IDLE_GRACE + Duration::from_secs(1)).await;
    let back = Instant::now();
    let names: Vec<String> = world.replicas.keys().cloned().collect();
    for name in names {
        world.start_replica(&name)?;
    }
    let forgiven = back_from_what_exists(world, state, stopped, back).await;
    Ok(format!(
        "controllers-away {} replicas past the idle grace ({}), {forgiven} deletions \
         undelivered when they went not expected",
        world.replicas.len(),
        if kill { "kill -9" } else { "graceful" }
    ))
}

/// Faults 8 to 14: the network between the controllers and dispatcher `i` (front), or between
/// it and the API server (api), cut, stalled or slowed for `hold`.
async fn network(world: &World, i: usize, kind: u32, hold: Duration) -> String {
    let (path, fault, name) = match kind {
        8 => ("front", Fault::Cut, "cut"),
        9 => ("front", Fault::Stall, "stall"),
        10 => (
            "front",
            Fault::Latency(Duration::from_millis(300)),
            "latency",
        ),
        11 => ("api", Fault::Cut, "cut"),
        12 => ("api", Fault::Stall, "stall"),
        13 => ("api", Fault::Latency(Duration::from_millis(300)), "latency"),
        _ => ("front", Fault::Cut, "cut"),
    };
    let Some(slot) = world.dispatchers.get(&i) else {
        return "network (no such dispatcher: skipped)".into();
    };
    let proxy = if path == "front" {
        &slot.front
    } else {
        &slot.api
    };
    proxy.set(fault);
    tokio::time::sleep(hold).await;
    proxy.set(Fault::None);
    if path == "front" {
        format!("net-{name} controllers<->dispatcher-{i}")
    } else {
        format!("net-{name} dispatcher-{i}<->apiserver")
    }
}

/// Fault 17: in one namespace, a child moves from one Widget to another and another Widget's
/// child is deleted while no dispatcher can reach the API server, whose watches then expire
/// (410) so that the changes are found only by the re-list. All three owners must be told.
pub(super) async fn owners_change_in_a_watch_gap(
    world: &mut World,
    state: &Mutex<WriterState>,
    rng: &mut StdRng,
) -> Result<String, Failure> {
    let objects = world.objects;
    let ns = world.namespaces[rng.random_range(0..world.namespaces.len())]
        .name()
        .to_owned();
    let mut picked = BTreeSet::new();
    while picked.len() < 3 {
        picked.insert(rng.random_range(0..objects));
    }
    let names: Vec<String> = picked.iter().map(|i| format!("obj-{i}")).collect();
    let (from, to, bereaved) = (&names[0], &names[1], &names[2]);
    let client = Cluster::shared().client().await?;
    let widgets: Api<Widget> = Api::namespaced(client.clone(), &ns);
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let mut uids = BTreeMap::new();
    for name in &names {
        match widgets.get_opt(name).await? {
            Some(w) => uids.insert(name.clone(), w.uid().unwrap_or_default()),
            None => {
                return Ok(format!(
                    "owners-change in a watch gap ({name} absent: skipped)"
                ));
            }
        };
    }
    let (label_key, label_value) = world.label.split_once('=').unwrap_or_default();
    let child = |name: &str, owner: &str| {
        serde_json::json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": name,
                "labels": { label_key: label_value },
                "ownerReferences": [{
                    "apiVersion": "test.kube-dispatch.dev/v1",
                    "kind": "Widget",
                    "name": owner,
                    "uid": uids[owner],
                    "controller": true,
                }],
            },
        })
    };
    // Children of their own, which the writer never touches.
    let moving = format!("{from}-moving");
    let doomed = format!("{bereaved}-doomed");
    let params = PatchParams::apply("kube-dispatch-chaos-owners").force();
    // Children indexed by each running dispatcher.
    let indexed = |world: &World| -> Vec<u64> {
        world
            .dispatchers
            .values()
            .filter_map(|slot| slot.running.as_ref())
            .map(|d| d.watch_total(|c| &c.children))
            .collect()
    };
    let children_before = indexed(world);
    let made = Instant::now();
    cms.patch(&moving, &params, &Patch::Apply(child(&moving, from)))
        .await?;
    cms.patch(&doomed, &params, &Patch::Apply(child(&doomed, bereaved)))
        .await?;
    // Once every running dispatcher has indexed the two children (its children gauge grew by
    // two) and both owners were reconciled since, the dispatchers know who owns them.
    let told: BTreeMap<String, Instant> = [from, bereaved]
        .iter()
        .map(|n| (format!("Widget/{ns}/{n}"), made))
        .collect();
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let now = indexed(world);
        let all_indexed = now.len() == children_before.len()
            && now.iter().zip(&children_before).all(|(n, b)| *n >= b + 2);
        if all_indexed && world.journal.unreconciled_since(&told, false).is_empty() {
            break;
        }
        if Instant::now() >= deadline {
            return Ok(format!(
                "owners-change in a watch gap ({ns}: children not indexed by every dispatcher within 15 s: skipped)"
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for slot in world.dispatchers.values() {
        slot.api.set(Fault::Cut);
    }
    let before = Instant::now();
    let changed: Result<(), Failure> = async {
        cms.patch(&moving, &params, &Patch::Apply(child(&moving, to)))
            .await?;
        cms.delete(&doomed, &DeleteParams::default()).await?;
        Ok(())
    }
    .await;
    // Resuming from before the gap must answer 410, so that only a re-list finds the changes.
    let restarted = Cluster::shared()
        .restart_apiserver_expiring_watches(&world.namespaces[0])
        .await;
    for slot in world.dispatchers.values() {
        slot.api.set(Fault::None);
    }
    changed?;
    restarted?;
    let mut s = state.lock().await;
    for name in [from, to, bereaved] {
        s.owned_changed(format!("Widget/{ns}/{name}"), before);
    }
    Ok(format!(
        "owners-change in a watch gap ({ns}: {moving} from {from} to {to}, {doomed} deleted; 410)"
    ))
}

/// How long before the controllers went away a deletion may still have been waiting in a
/// group that fault 18 then drops: the longest a fault before it delays delivery.
pub(super) const AWAY_REACH: Duration = Duration::from_secs(20);

/// After fault 18: waits until every object that exists was handed to the controllers again
/// since they came `back` (so every dispatcher has its group again), lets the writer delete
/// again, and forgets the writer's deletions made from `AWAY_REACH` before they `stopped` that
/// no reconcile saw: the dropped groups held them, and the contract does not deliver them.
/// Returns how many.
pub(super) async fn back_from_what_exists(
    world: &World,
    state: &Mutex<WriterState>,
    stopped: Instant,
    back: Instant,
) -> usize {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let live: BTreeMap<String, Instant> = state
            .lock()
            .await
            .live
            .iter()
            .map(|k| (k.clone(), back))
            .collect();
        // Not within the deadline: the final check reports the objects never handed back.
        if world.journal.unreconciled_since(&live, false).is_empty() || Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut s = state.lock().await;
    s.pause_deletions = false;
    let unseen: BTreeSet<String> = world
        .journal
        .unreconciled_since(&s.deleted, true)
        .into_iter()
        .collect();
    let before = s.deleted.len();
    let from = stopped.checked_sub(AWAY_REACH).unwrap_or(stopped);
    s.deleted
        .retain(|k, at| !(unseen.contains(k) && *at >= from && *at <= stopped));
    before - s.deleted.len()
}
