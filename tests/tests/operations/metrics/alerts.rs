//! The alert rules of `deploy/prometheus` in a real Prometheus, scraping a real dispatcher of
//! the real API server: a dispatcher cut off from the API server cannot renew its Lease, and
//! `KubeDispatchLeaseRenewalsFailing` fires, read back through Prometheus's API, within the
//! rule's `for` and a scrape of its expression holding; once the dispatcher reaches the API
//! server again, the alert resolves.

use std::{path::Path, time::Duration};

use kube_dispatch_telemetry::{
    admin::{self, Readiness},
    metrics::Metrics,
};
use kube_dispatch_tests::{
    Cluster, TestNamespace, TestResult,
    dispatcher::{TestDispatcher, lease_config},
    eventually,
    faultproxy::{Fault, FaultProxy},
    prometheus::Prometheus,
};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const ALERT: &str = "KubeDispatchLeaseRenewalsFailing";
/// The rule's `for` in this test, and the window of its rates (the shipped rule's are 2m and
/// 5m; the chart makes the first a value).
const FOR: Duration = Duration::from_secs(5);

/// The shipped rules file with the alert alone, its rate windows and `for` in seconds.
fn rules_for_test() -> TestResult<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy/prometheus/kube-dispatch-alerts.yaml");
    let text = std::fs::read_to_string(path)?;
    let start = text
        .find(&format!("      - alert: {ALERT}\n"))
        .ok_or("the rules file has no such alert")?;
    let end = text[start + 1..]
        .find("\n      - alert: ")
        .map_or(text.len(), |e| start + 1 + e + 1);
    let rule = &text[start..end];
    if rule.matches("[5m]").count() != 2 || rule.matches("for: 2m\n").count() != 1 {
        return Err(format!("the rule is not as this test expects it:\n{rule}").into());
    }
    let rule = rule
        .replace("[5m]", "[10s]")
        .replace("for: 2m\n", &format!("for: {}s\n", FOR.as_secs()));
    Ok(format!("groups:\n  - name: test\n    rules:\n{rule}"))
}

#[tokio::test]
async fn a_dispatcher_that_cannot_renew_its_lease_fires_its_alert_until_it_renews() -> TestResult {
    let ns = TestNamespace::create("alerts").await?;
    let proxy = FaultProxy::start(Cluster::shared().apiserver_addr().await?).await?;
    let metrics = Metrics::default();
    let mut config = lease_config(ns.name(), "dispatcher-0", Duration::from_secs(3));
    config.metrics = metrics.clone();
    let d = TestDispatcher::start_with(config, "127.0.0.1:0", Some(proxy.addr), None).await?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let endpoint = listener.local_addr()?;
    let stop = CancellationToken::new();
    tokio::spawn(admin::serve(
        listener,
        Readiness::new("test"),
        metrics.clone(),
        stop.clone(),
    ));
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("prometheus-{}", ns.name()));
    let prometheus = Prometheus::start(dir, &[endpoint], &rules_for_test()?).await?;

    // Renewals accepted, on record: the alert is not even pending.
    eventually(
        Duration::from_secs(30),
        "accepted renewals scraped",
        || async {
            let accepted = prometheus
                .query(r#"sum(rate(kube_dispatch_lease_renewals_total{outcome="accepted"}[10s]))"#)
                .await
                .ok()??;
            (accepted > 0.0).then_some(())
        },
    )
    .await?;
    assert_eq!(
        prometheus.alerts(ALERT).await?,
        [],
        "silent while renewals are accepted"
    );

    // Cut off: the renewals fail, the alert goes pending, then fires once FOR has passed.
    proxy.set(Fault::Cut);
    let cut = Instant::now();
    let pending = eventually(Duration::from_secs(60), "the alert pending", || async {
        let alerts = prometheus.alerts(ALERT).await.ok()?;
        alerts
            .iter()
            .any(|a| a.state == "pending" || a.state == "firing")
            .then(Instant::now)
    })
    .await?;
    let fired = eventually(Duration::from_secs(30), "the alert firing", || async {
        let alerts = prometheus.alerts(ALERT).await.ok()?;
        let firing = alerts.into_iter().find(|a| a.state == "firing")?;
        Some((Instant::now(), firing))
    })
    .await?;
    let (fired_at, alert) = fired;
    assert_eq!(alert.labels["severity"], "critical");
    assert_eq!(alert.labels["job"], "tier");
    let waited = fired_at - pending;
    // Pending is seen up to an evaluation late, firing up to an evaluation and a scrape late.
    assert!(
        waited + Duration::from_secs(1) >= FOR && waited <= FOR + Duration::from_secs(3),
        "fired {waited:?} after it was seen pending; its for is {FOR:?}"
    );

    // Back: renewals are accepted again, and the alert resolves.
    proxy.set(Fault::None);
    let back = Instant::now();
    eventually(Duration::from_secs(60), "the alert resolved", || async {
        prometheus
            .alerts(ALERT)
            .await
            .ok()?
            .is_empty()
            .then_some(())
    })
    .await?;
    println!(
        "alerts: pending {:?} after the cut, firing {waited:?} later, resolved {:?} after the API server was back",
        pending - cut,
        back.elapsed()
    );
    // What a dispatcher with Lease membership exports, for the checks of the rules' names.
    super::support::record_exported("dispatcher-leases", &metrics.encode())?;
    stop.cancel();
    d.stop().await;
    Ok(())
}
