//! A kube-rs controller that found its children in a reflector store finds them with
//! `reads::children` instead: exactly its own, those it created included, each taken from its
//! request where the dispatcher sent the child's body (no read), else read by name from the
//! watch cache as its request lists them (one GET per child), and one LIST where it lists none
//! or does not show yet a child the controller created (its watch behind the write).

use std::collections::HashMap;

use k8s_openapi::api::core::v1::Secret;
use kube::Resource;
use kube_dispatch_controller::{children, reads};

use super::support::*;

const LABEL: &str = "example.kube-dispatch.dev/reads=yes";

/// A reconcile's owner, the children it listed, and how many its request showed, and of those
/// how many without their bodies, and whether its request was older than a child an earlier
/// reconcile of the owner created.
type Listed = (String, Vec<String>, Option<(usize, usize)>, bool);

struct Parents {
    client: kube::Client,
    /// What each reconcile of an owner listed, in order, and how many Secret children its
    /// request showed when it listed them completely, and how many of those without bodies:
    /// (owner, children listed, (shown, without bodies)).
    listed: Mutex<Vec<Listed>>,
    /// A child created twice: the list had missed it.
    missed: Mutex<Vec<String>>,
    /// The newest resourceVersion of a child created, by owner.
    created: Mutex<HashMap<String, u64>>,
}

async fn reconcile(owner: Arc<ConfigMap>, ctx: Arc<Parents>) -> Result<Action, kube::Error> {
    let name = owner.name_any();
    let secrets: Api<Secret> =
        Api::namespaced(ctx.client.clone(), &owner.namespace().unwrap_or_default());
    let known = children::of_this_reconcile().filter(|c| c.is_complete());
    let shown = known.as_ref().map(|c| {
        let shown: Vec<_> = c.of::<Secret>().collect();
        let bare = shown.iter().filter(|c| c.object_json.is_empty()).count();
        (shown.len(), bare)
    });
    let newest_shown = known
        .iter()
        .flat_map(|c| c.of::<Secret>())
        .filter_map(|c| c.resource_version.parse::<u64>().ok())
        .max()
        .unwrap_or(0);
    let behind = ctx
        .created
        .lock()
        .expect("the children created")
        .get(&name)
        .is_some_and(|created| *created > newest_shown);
    let mut listed: Vec<String> = reads::children(&secrets, owner.as_ref())
        .await?
        .iter()
        .map(ResourceExt::name_any)
        .collect();
    listed.sort();
    ctx.listed.lock().expect("the list of reconciles").push((
        name.clone(),
        listed.clone(),
        shown,
        behind,
    ));
    for suffix in ["a", "b"] {
        let child_name = format!("{name}-{suffix}");
        if listed.contains(&child_name) {
            continue;
        }
        let mut child = Secret::default();
        child.metadata.name = Some(child_name.clone());
        child.metadata.owner_references = owner.controller_owner_ref(&()).map(|r| vec![r]);
        match secrets.create(&PostParams::default(), &child).await {
            Err(kube::Error::Api(status)) if status.code == 409 => {
                ctx.missed
                    .lock()
                    .expect("the missed children")
                    .push(child_name);
            }
            other => {
                let version = other?.metadata.resource_version.unwrap_or_default();
                let mut created = ctx.created.lock().expect("the children created");
                let newest = created.entry(name.clone()).or_default();
                *newest = (*newest).max(version.parse().unwrap_or(0));
            }
        }
    }
    Ok(Action::await_change())
}

fn error_policy(_: Arc<ConfigMap>, _: &kube::Error, _: Arc<Parents>) -> Action {
    Action::requeue(Duration::from_millis(200))
}

#[tokio::test]
async fn children_read_as_from_a_store_cost_no_read_where_the_request_carries_them() -> TestResult {
    let ns = TestNamespace::create("sdk-reads").await?;
    let d = TestDispatcher::start(test_config("dispatcher-0", &["dispatcher-0"])).await?;
    let group = format!("reads-{}", ns.name());
    let admin = free_port()?;
    let stop = CancellationToken::new();
    let controller = Controller::<ConfigMap>::new(ns.client(), group.as_str())
        .namespace(ns.name())
        .labels(LABEL)
        .owns::<Secret>()
        .dispatchers([d.addr.to_string()])
        .credentials(kube_dispatch_tests::credentials())
        .admin_listen(admin)
        .graceful_shutdown_on(stop.clone().cancelled_owned());
    let ctx = Arc::new(Parents {
        client: controller.client(),
        listed: Mutex::default(),
        missed: Mutex::default(),
        created: Mutex::default(),
    });
    let stream = controller.run(reconcile, error_policy, Arc::clone(&ctx));
    let task = tokio::spawn(stream.for_each(|_| async {}));

    let api: Api<ConfigMap> = Api::namespaced(ns.client(), ns.name());
    let (key, value) = LABEL.split_once('=').unwrap_or_default();
    for name in ["one", "two"] {
        let mut cm = ConfigMap::default();
        cm.metadata.name = Some(name.into());
        cm.metadata.labels = Some([(key.to_owned(), value.to_owned())].into());
        api.create(&PostParams::default(), &cm).await?;
    }
    for name in ["one", "two"] {
        let want = vec![format!("{name}-a"), format!("{name}-b")];
        eventually(
            Duration::from_secs(30),
            format!("{name}'s reconcile listing both its children"),
            || {
                let ctx = Arc::clone(&ctx);
                let want = want.clone();
                async move {
                    let listed = ctx.listed.lock().expect("the list of reconciles");
                    listed
                        .iter()
                        .rev()
                        .find(|(owner, ..)| owner == name)
                        .filter(|(_, children, ..)| *children == want)
                        .map(|_| ())
                }
            },
        )
        .await?;
    }

    let listed = ctx.listed.lock().expect("the list of reconciles").clone();
    for (owner, children, ..) in &listed {
        assert!(
            children.iter().all(|c| c.starts_with(&format!("{owner}-"))),
            "{owner} listed {children:?}"
        );
    }
    assert_eq!(
        *ctx.missed.lock().unwrap(),
        Vec::<String>::new(),
        "a list missed a child"
    );
    let (shown, gets, lists) = reads_expected(&listed);
    assert!(shown > 0, "no reconcile was shown its children: {listed:?}");
    assert!(
        gets < shown,
        "the dispatcher sent no child's body: {listed:?}"
    );
    let (status, text) = http_get(admin, "/metrics").await?;
    assert_eq!(status, 200);
    let counted = samples(&text, &group);
    let verb = |v: &str| {
        counted
            .get(&format!(
                r#"kube_dispatch_api_requests_total{{controller="{group}",verb="{v}"}}"#
            ))
            .copied()
            .unwrap_or(0.0)
    };
    assert_eq!(
        (verb("list"), verb("get")),
        (lists as f64, gets as f64),
        "a GET of each child a request listed without its body, a LIST where it listed none, over {listed:?}"
    );

    stop.cancel();
    tokio::time::timeout(Duration::from_secs(30), task).await??;
    d.stop().await;
    Ok(())
}

/// What the reconciles in `listed` should have cost: children shown, GETs and LISTs. A request
/// that lists some children completely, and shows every child created: a GET of each it
/// carries without a body; otherwise one LIST.
fn reads_expected(listed: &[Listed]) -> (usize, usize, usize) {
    let shown: usize = listed
        .iter()
        .filter_map(|(_, _, s, _)| s.map(|s| s.0))
        .sum();
    let gets: usize = listed
        .iter()
        .filter(|(.., behind)| !behind)
        .filter_map(|(_, _, s, _)| s.map(|s| s.1))
        .sum();
    let lists = listed
        .iter()
        .filter(|(_, _, s, behind)| s.unwrap_or_default().0 == 0 || *behind)
        .count();
    (shown, gets, lists)
}
