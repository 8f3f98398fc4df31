//! What the API server itself reports: its request counters (`/metrics`) and the CPU time of
//! the kube-apiserver and etcd processes of the local control plane.

use std::{collections::BTreeMap, path::Path};

use anyhow::Context as _;
use jiff::Timestamp;
use kube::Client;

use super::process::cpu_seconds;

/// `apiserver_request_total` summed by (resource, verb), status subresources left out, less
/// the list, watch and get requests of the control plane's own clients (see
/// [`request_counts`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct RequestCounts(BTreeMap<(String, String), f64>);

impl RequestCounts {
    /// Parses the Prometheus text format of `/metrics`.
    pub(crate) fn parse(metrics: &str) -> Self {
        let mut counts = BTreeMap::new();
        for line in metrics.lines() {
            let Some(rest) = line.strip_prefix("apiserver_request_total{") else {
                continue;
            };
            let Some((labels, value)) = rest.rsplit_once("} ") else {
                continue;
            };
            let Ok(value) = value.trim().parse::<f64>() else {
                continue;
            };
            let label = |name: &str| {
                labels
                    .split(',')
                    .find_map(|kv| kv.strip_prefix(name)?.strip_prefix("=\""))
                    .map(|v| v.trim_end_matches('"').to_owned())
                    .unwrap_or_default()
            };
            if !label("subresource").is_empty() {
                continue;
            }
            *counts
                .entry((label("resource"), label("verb")))
                .or_insert(0.0) += value;
        }
        Self(counts)
    }

    /// The requests an audit log in JSON lines records (one event a request: the cluster
    /// script's policy keeps only `ResponseComplete`, the stage at which the API server counts
    /// a request in `apiserver_request_total`) whose events were complete before `before`, by
    /// resource and upper-case verb, subresources left out. An event without a time it was
    /// complete at is taken as complete.
    pub(crate) fn audited(log: &str, before: Timestamp) -> Self {
        let mut counts = BTreeMap::new();
        for line in log.lines() {
            let Ok(event) = serde_json::from_str::<serde_json::Value>(line) else {
                continue;
            };
            let object = &event["objectRef"];
            if event["stage"] != "ResponseComplete" || object.get("subresource").is_some() {
                continue;
            }
            let complete = event["stageTimestamp"]
                .as_str()
                .and_then(|t| t.parse::<Timestamp>().ok());
            if complete.is_some_and(|t| t >= before) {
                continue;
            }
            let (Some(resource), Some(verb)) =
                (object["resource"].as_str(), event["verb"].as_str())
            else {
                continue;
            };
            *counts
                .entry((resource.to_owned(), verb.to_uppercase()))
                .or_insert(0.0) += 1.0;
        }
        Self(counts)
    }

    /// These counts less `other`'s, if any.
    pub(crate) fn less(mut self, other: Option<&Self>) -> Self {
        for (key, value) in other.iter().flat_map(|o| &o.0) {
            if let Some(count) = self.0.get_mut(key) {
                *count -= value;
            }
        }
        self
    }

    /// Every (resource, verb) whose count moved since `earlier`, one line each, largest first.
    pub(crate) fn changes_since(&self, earlier: &Self) -> String {
        let mut moved: Vec<(u64, &str, &str)> = self
            .0
            .keys()
            .map(|(resource, verb)| {
                (
                    self.since(earlier, resource, verb),
                    resource.as_str(),
                    verb.as_str(),
                )
            })
            .filter(|(n, ..)| *n > 0)
            .collect();
        moved.sort_unstable_by(|a, b| b.cmp(a));
        moved
            .iter()
            .map(|(n, resource, verb)| format!("{n:>8} {verb} {resource}\n"))
            .collect()
    }

    /// Requests of `verb` on `resource` counted since `earlier`.
    pub(crate) fn since(&self, earlier: &Self, resource: &str, verb: &str) -> u64 {
        let key = (resource.to_owned(), verb.to_owned());
        let now = self.0.get(&key).copied().unwrap_or(0.0);
        let then = earlier.0.get(&key).copied().unwrap_or(0.0);
        // Counters are whole numbers printed as floats.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let delta = (now - then).max(0.0).round() as u64;
        delta
    }
}

/// Reads the API server's request counters, less the list, watch and get requests of the
/// control plane's own clients: kube-controller-manager's informers (its garbage collector watches
/// every resource, its namespace controller lists every resource of a namespace it deletes) and
/// the API server's loopback ones end their watches every few minutes and watch again, which
/// would be counted against whatever runs at the time; its garbage collector also reads, by a
/// GET each, the owners of objects that change, for up to half a minute after their kind is new
/// to it. The cluster script audits those requests alone (`control-plane-audit.log`, and its
/// one rotated file); a control plane started before it did is counted whole, with a warning.
/// Like the counters themselves, differences mean something only within one API-server process.
///
/// What is left out are the requests whose audit events were complete before `/metrics` was
/// asked for: the API server counts a request, then completes its event, so each of them is in
/// the counters. A request that ends while `/metrics` is answered is in them too, but left out
/// only at the next reading: while the garbage collector reads owners, at 10 to 40 a second, a
/// reading can come out a request long. Leaving out whatever the log held when read, after the
/// counters, left out the requests that ended in between uncounted, as many as ended during
/// the reading's whole round (the counters' answer, their parsing, the log's read): a reading
/// taken during such a burst came out several requests short, and the window that began with
/// it as many long.
pub(crate) async fn request_counts(client: &Client) -> anyhow::Result<RequestCounts> {
    let (metrics, own) = metrics_and_own(client).await?;
    Ok(RequestCounts::parse(&metrics).less(own.as_ref()))
}

/// The API server's `/metrics`, as text, and the control plane's own requests its counters hold
/// (see [`request_counts`]); `None` without an audit log.
pub(crate) async fn metrics_and_own(
    client: &Client,
) -> anyhow::Result<(String, Option<RequestCounts>)> {
    let (asked, metrics) = metrics_asked(client).await?;
    Ok((metrics, control_plane_requests(asked)?))
}

/// The control plane's own list, watch and get requests completed before `before`, from its
/// audit log (see [`request_counts`]); `None` without one.
fn control_plane_requests(before: Timestamp) -> anyhow::Result<Option<RequestCounts>> {
    let logs = kube_dispatch_tests::Cluster::shared().dir().join("logs");
    let current = logs.join("control-plane-audit.log");
    if !current.exists() {
        static WARNED: std::sync::Once = std::sync::Once::new();
        WARNED.call_once(|| {
            eprintln!(
                "warning: no {}: the control plane predates its audit log, so request counts \
                 include its own clients' (restart it: tests/cluster/cluster.sh down, then up)",
                current.display()
            );
        });
        return Ok(None);
    }
    let mut text = String::new();
    let entries =
        std::fs::read_dir(&logs).with_context(|| format!("cannot read {}", logs.display()))?;
    for entry in entries {
        let path = entry?.path();
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        if name.starts_with("control-plane-audit") && name.ends_with(".log") {
            text.push_str(
                &std::fs::read_to_string(&path)
                    .with_context(|| format!("cannot read {}", path.display()))?,
            );
        }
    }
    Ok(Some(RequestCounts::audited(&text, before)))
}

/// The API server's `/metrics`, as text (each reading [`retried`]).
pub(crate) async fn metrics_text(client: &Client) -> anyhow::Result<String> {
    Ok(metrics_asked(client).await?.1)
}

/// The API server's `/metrics`, as text, and when the attempt that read it asked for it (each
/// reading [`retried`]).
async fn metrics_asked(client: &Client) -> anyhow::Result<(Timestamp, String)> {
    retried(|| async {
        let request = http::Request::get("/metrics")
            .body(Vec::new())
            .context("cannot build the /metrics request")?;
        let asked = Timestamp::now();
        Ok((asked, client.request_text(request).await?))
    })
    .await
    .context("cannot read the API server's /metrics")
}

/// The longest one of the harness's own requests between runs may take.
const REQUEST_DEADLINE: std::time::Duration = std::time::Duration::from_secs(20);
/// How many times such a request is made before a run fails.
const REQUEST_ATTEMPTS: usize = 3;

/// `request` made until it succeeds, each attempt within [`REQUEST_DEADLINE`], at most
/// [`REQUEST_ATTEMPTS`] times: a request on a connection the API server dropped (it restarted,
/// or stalled under load) would otherwise wait out kube's read timeout (295 s), longer than a
/// smoke test's deadline. The last attempt's error if none succeeds.
pub(crate) async fn retried<T, F, Fut>(request: F) -> anyhow::Result<T>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<T>>,
{
    let mut last = anyhow::anyhow!("no attempt made");
    for _ in 0..REQUEST_ATTEMPTS {
        match tokio::time::timeout(REQUEST_DEADLINE, request()).await {
            Ok(Ok(done)) => return Ok(done),
            Ok(Err(e)) => last = e,
            Err(_) => last = anyhow::anyhow!("no answer within {REQUEST_DEADLINE:?}"),
        }
    }
    Err(last)
}

/// A CPU profile of the kube-apiserver over `seconds` (Go's pprof format, from its
/// `/debug/pprof/profile`), for looking into where a phase's API-server CPU went:
/// `go tool pprof -top -diff_base=<one> <other>` compares two variants' profiles.
pub(crate) async fn cpu_profile(client: &Client, seconds: u64) -> anyhow::Result<Vec<u8>> {
    use http_body_util::BodyExt as _;
    let request = http::Request::get(format!("/debug/pprof/profile?seconds={seconds}"))
        .body(kube::client::Body::empty())
        .context("cannot build the profile request")?;
    let response = client
        .send(request)
        .await
        .context("cannot ask the API server for a CPU profile")?;
    anyhow::ensure!(
        response.status().is_success(),
        "the API server refused a CPU profile ({}): start the control plane with \
         KD_APISERVER_PROFILING=true tests/cluster/cluster.sh up (after cluster.sh down)",
        response.status()
    );
    let body = response
        .into_body()
        .collect()
        .await
        .context("cannot read the API server's CPU profile")?;
    Ok(body.to_bytes().to_vec())
}

/// The sum of the samples of `name` whose labels include every one of `labels` (`key="value"`).
pub(crate) fn sum_where(metrics: &str, name: &str, labels: &[&str]) -> f64 {
    metrics
        .lines()
        .filter_map(|line| line.strip_prefix(name)?.strip_prefix('{'))
        .filter_map(|rest| rest.rsplit_once("} "))
        .filter(|(found, _)| labels.iter().all(|l| found.split(',').any(|f| f == *l)))
        .filter_map(|(_, value)| value.trim().parse::<f64>().ok())
        .sum()
}

/// The kube-apiserver and etcd processes of the local control plane, from the state file the
/// cluster script writes (`state.env` in `$KD_CLUSTER_DIR`, by default `.cluster`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct ControlPlane {
    apiserver: u32,
    etcd: u32,
}

impl ControlPlane {
    pub(crate) fn from_state(root: &Path) -> anyhow::Result<Self> {
        let dir = std::env::var_os("KD_CLUSTER_DIR")
            .filter(|d| !d.is_empty())
            .map_or_else(|| root.join(".cluster"), std::path::PathBuf::from);
        let path = dir.join("state.env");
        let state = std::fs::read_to_string(&path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        let pid = |name: &str| -> anyhow::Result<u32> {
            state
                .lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix('='))
                .and_then(|v| v.trim().parse().ok())
                .with_context(|| format!("no {name} in {}", path.display()))
        };
        Ok(Self {
            apiserver: pid("APISERVER_PID")?,
            etcd: pid("ETCD_PID")?,
        })
    }

    /// CPU seconds used so far by the kube-apiserver and by etcd.
    pub(crate) fn cpu_seconds(&self) -> (f64, f64) {
        (
            cpu_seconds(self.apiserver).unwrap_or(f64::NAN),
            cpu_seconds(self.etcd).unwrap_or(f64::NAN),
        )
    }

    /// Waits until the kube-apiserver has used at most [`QUIET_SHARE`] of a core over the last
    /// [`QUIET_WINDOW`], or [`QUIET_AT_MOST`] has passed: the work a phase left it (requests
    /// still in flight, the garbage its allocations made) is done before the next phase is
    /// measured, so each phase's CPU is its own. Returns how long it waited.
    pub(crate) async fn quiet(&self) -> std::time::Duration {
        let start = tokio::time::Instant::now();
        let mut last = self.cpu_seconds().0;
        while start.elapsed() < QUIET_AT_MOST {
            tokio::time::sleep(QUIET_WINDOW).await;
            let now = self.cpu_seconds().0;
            let used = now - last;
            last = now;
            // NaN (the process is gone) ends the wait too: the phase fails elsewhere.
            if used.is_nan() || used <= QUIET_SHARE * QUIET_WINDOW.as_secs_f64() {
                break;
            }
        }
        start.elapsed()
    }
}

/// The window over which the kube-apiserver's CPU is judged quiet ([`ControlPlane::quiet`]).
const QUIET_WINDOW: std::time::Duration = std::time::Duration::from_secs(1);

/// At most this share of a core over [`QUIET_WINDOW`] is quiet: an idle local API server with
/// a tier's Leases renewing uses under a tenth.
const QUIET_SHARE: f64 = 0.15;

/// The longest wait for quiet.
const QUIET_AT_MOST: std::time::Duration = std::time::Duration::from_secs(30);

#[cfg(test)]
mod tests {
    #[test]
    fn sum_where_adds_the_series_with_every_label() {
        let text = "x_sum{resource=\"configmaps\",scope=\"cluster\",verb=\"LIST\"} 10\nx_sum{resource=\"configmaps\",scope=\"namespace\",verb=\"LIST\"} 5\nx_sum{resource=\"configmaps\",verb=\"WATCH\"} 7\nx_sumx{resource=\"configmaps\",verb=\"LIST\"} 99\n";
        let list = ["resource=\"configmaps\"", "verb=\"LIST\""];
        assert_eq!(super::sum_where(text, "x_sum", &list), 15.0);
        assert_eq!(super::sum_where(text, "x_sum", &[]), 22.0);
    }

    use super::*;

    #[test]
    fn counts_are_summed_by_resource_and_verb_without_subresources() {
        let before = RequestCounts::parse(
            r#"# HELP apiserver_request_total x
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="configmaps",scope="namespace",subresource="",verb="LIST",version="v1"} 3
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="configmaps",scope="cluster",subresource="",verb="LIST",version="v1"} 1
"#,
        );
        let after = RequestCounts::parse(
            r#"apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="configmaps",scope="namespace",subresource="",verb="LIST",version="v1"} 10
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="configmaps",scope="cluster",subresource="",verb="LIST",version="v1"} 2
apiserver_request_total{code="200",component="apiserver",dry_run="",group="bench.kube-dispatch.dev",resource="records",scope="namespace",subresource="status",verb="PATCH",version="v1"} 7
apiserver_request_total{code="0",component="apiserver",dry_run="",group="",resource="configmaps",scope="namespace",subresource="",verb="WATCH",version="v1"} 4
"#,
        );
        assert_eq!(after.since(&before, "configmaps", "LIST"), 8);
        assert_eq!(after.since(&before, "configmaps", "WATCH"), 4);
        assert_eq!(after.since(&before, "records", "PATCH"), 0);
        assert_eq!(after.since(&before, "configmaps", "GET"), 0);
    }

    #[test]
    fn the_control_planes_audited_requests_are_left_out() {
        let metrics = RequestCounts::parse(
            r#"apiserver_request_total{code="0",component="apiserver",dry_run="",group="",resource="configmaps",scope="cluster",subresource="",verb="WATCH",version="v1"} 5
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="configmaps",scope="cluster",subresource="",verb="LIST",version="v1"} 3
"#,
        );
        let audit = r#"{"kind":"Event","stage":"ResponseComplete","verb":"watch","user":{"username":"system:kube-controller-manager"},"objectRef":{"resource":"configmaps","apiVersion":"v1"}}
{"kind":"Event","stage":"ResponseComplete","verb":"watch","user":{"username":"system:apiserver"},"objectRef":{"resource":"configmaps","namespace":"kube-system","apiVersion":"v1"}}
{"kind":"Event","stage":"ResponseComplete","verb":"list","user":{"username":"system:kube-controller-manager"},"objectRef":{"resource":"secrets","apiVersion":"v1"}}
{"kind":"Event","stage":"ResponseComplete","verb":"watch","user":{"username":"system:kube-controller-manager"},"objectRef":{"resource":"pods","subresource":"status","apiVersion":"v1"}}
not json
"#;
        let without = metrics.less(Some(&RequestCounts::audited(audit, Timestamp::MAX)));
        let none = RequestCounts::default();
        assert_eq!(without.since(&none, "configmaps", "WATCH"), 3);
        assert_eq!(without.since(&none, "configmaps", "LIST"), 3);
        assert_eq!(without.since(&none, "secrets", "LIST"), 0);
    }

    #[test]
    fn only_the_requests_complete_before_the_counters_were_asked_for_are_left_out() {
        let metrics = RequestCounts::parse(
            r#"apiserver_request_total{code="200",component="apiserver",dry_run="",group="bench.kube-dispatch.dev",resource="records",scope="resource",subresource="",verb="GET",version="v1"} 7
"#,
        );
        let get = |at: &str| {
            format!(
                r#"{{"kind":"Event","stage":"ResponseComplete","verb":"get","stageTimestamp":"{at}","user":{{"username":"system:kube-controller-manager"}},"objectRef":{{"resource":"records","name":"obj-000001"}}}}"#
            )
        };
        // The garbage collector read an owner twice before the counters were asked for, and
        // three times while they were being read: those are not in them yet.
        let audit = [
            get("2026-12-04T08:55:09.100000Z"),
            get("2026-12-04T08:55:09.199999Z"),
            get("2026-12-04T08:55:09.200000Z"),
            get("2026-12-04T08:55:09.300000Z"),
            get("2026-12-04T08:55:09.400000Z"),
        ]
        .join("\n");
        let asked: Timestamp = "2026-12-04T08:55:09.2Z".parse().expect("a time");
        let without = metrics.less(Some(&RequestCounts::audited(&audit, asked)));
        assert_eq!(
            without.since(&RequestCounts::default(), "records", "GET"),
            5
        );
    }
}
