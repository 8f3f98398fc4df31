//! Test fixture for kube-dispatch integration tests: a real kube-apiserver and etcd on loopback.
//!
//! [`Cluster::shared`] attaches to the control plane that `tests/cluster/cluster.sh` runs,
//! starting it (once per test process) if it is not running; [`TestNamespace::create`] gives each
//! test a namespace of its own that is deleted when the value is dropped, also when the test
//! fails. Set `KD_KEEP_NAMESPACES=1` to keep them for a post-mortem.
//!
//! ```no_run
//! use k8s_openapi::api::core::v1::ConfigMap;
//! use kube::api::{Api, PostParams};
//! use kube_dispatch_tests::TestNamespace;
//!
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! let ns = TestNamespace::create("example").await?;
//! let configmaps: Api<ConfigMap> = Api::namespaced(ns.client(), ns.name());
//! let mut cm = ConfigMap::default();
//! cm.metadata.name = Some("demo".into());
//! configmaps.create(&PostParams::default(), &cm).await?;
//! # Ok(())
//! # }
//! ```
//!
//! | module | holds |
//! | --- | --- |
//! | this one | the shared control plane ([`Cluster`]), per-test namespaces ([`TestNamespace`]), the tier's TLS files and test identity ([`credentials`], [`serving_tls`]) |
//! | [`dispatcher`] | in-process dispatchers and raw sessions for tests ([`dispatcher::TestDispatcher`]) |
//! | [`loadbalancer`] | in-process load balancers |
//! | [`identity`] | ServiceAccounts with a Role on ConfigMaps, and their tokens |
//! | [`journal`] | the record of writes and reconciles, its verdicts, and the journal replica |
//! | [`chaos`] | the chaos suite: the whole tier under seeded faults, and its report |
//! | [`faultproxy`] | a loopback TCP proxy that cuts, stalls and delays connections |
//! | [`isolated`] | a component on a runtime of its own, so a test can kill it as a crash would |

#![forbid(unsafe_code)]

pub mod apf;
pub mod chaos;
pub mod dispatcher;
pub mod faultproxy;
pub mod flood;
pub mod http;
pub mod identity;
pub mod isolated;
pub mod journal;
pub mod leases;
pub mod loadbalancer;
mod namespace;
pub mod prometheus;

pub use namespace::TestNamespace;

/// What a controller asks of the API server, per reconcile: `client` counting its requests by
/// verb (as the Rust SDK's `api_requests` counts them), and a count of reconciles to divide by.
#[derive(Clone, Debug, Default)]
pub struct RequestsPerReconcile {
    requests: std::sync::Arc<kube_dispatch_controller::api_requests::RequestCounts>,
    reconciles: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl RequestsPerReconcile {
    /// `client`, counting here each request it sends.
    pub fn count(&self, client: Client) -> Client {
        kube_dispatch_controller::api_requests::counted(client, self.requests.clone())
    }

    /// `reconcile`, counting each call here.
    pub fn around<O, C, R, F: Fn(O, C) -> R + Send + Sync>(
        &self,
        reconcile: F,
    ) -> impl Fn(O, C) -> R + Send + Sync + use<O, C, R, F> {
        let reconciles = self.reconciles.clone();
        move |object, context| {
            reconciles.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            reconcile(object, context)
        }
    }

    /// The requests by verb, each divided by the reconciles: `"12 reconciles: get 1.00, ..."`
    /// (verbs with no request left out).
    pub fn summary(&self) -> String {
        use kube_dispatch_controller::api_requests::Verb;
        let reconciles = self.reconciles.load(std::sync::atomic::Ordering::Relaxed);
        let per = |n: u64| n as f64 / reconciles.max(1) as f64;
        let verbs: Vec<String> = Verb::ALL
            .iter()
            .filter(|v| self.requests.of(**v) > 0)
            .map(|v| format!("{} {:.2}", v.as_str(), per(self.requests.of(*v))))
            .collect();
        format!(
            "{reconciles} reconciles, {:.2} requests each: {}",
            per(self.requests.total()),
            verbs.join(", ")
        )
    }
}

use std::{
    path::{Path, PathBuf},
    process::Command,
    sync::OnceLock,
    time::Duration,
};

use kube::{
    Client, Config,
    api::{Api, PostParams},
    config::{KubeConfigOptions, Kubeconfig},
};

/// What can go wrong while setting up a test against the real control plane.
#[derive(Debug, thiserror::Error)]
pub enum FixtureError {
    /// A cluster script could not be run or failed.
    #[error("`{command}` failed: {detail}")]
    Script {
        /// The command line that was run.
        command: String,
        /// Its exit status and standard error, or why it could not start.
        detail: String,
    },
    /// The kubeconfig the cluster script printed could not be loaded.
    #[error("cannot load kubeconfig {path}: {source}")]
    Kubeconfig {
        /// Where the kubeconfig was expected.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// A Kubernetes API call failed.
    #[error(transparent)]
    Kube(#[from] kube::Error),
    /// The cluster did not reach the state a fixture waits for.
    #[error("{0}")]
    Timeout(String),
}

/// Any error of a test: it fails the test with its message. Sendable, so that the errors of
/// spawned tasks pass through `?` too.
pub type TestError = Box<dyn std::error::Error + Send + Sync>;

/// What a test (or a step of one) returns.
pub type TestResult<T = ()> = Result<T, TestError>;

/// The user of the test identity (`tests/cluster/cluster.sh`): a ServiceAccount bound to
/// cluster-admin, so it may read everything and may call Peer in test dispatchers.
pub const TESTER: &str = "system:serviceaccount:kube-dispatch-tests:tester";

/// How tests reach the tier: TLS against the cluster's CA, with the test identity's token.
pub fn credentials() -> kube_dispatch_proto::credentials::Credentials {
    let dir = Cluster::shared().dir();
    kube_dispatch_proto::credentials::Credentials::tls(dir.join("pki/ca.crt"))
        .with_token_file(dir.join("tokens/tester.token"))
}

/// The tier's serving certificate in tests (for 127.0.0.1 and localhost); `next` is a second
/// one signed by the same CA, to show a rotation.
pub fn serving_tls(next: bool) -> kube_dispatch_server::tls::ServerTls {
    let pki = Cluster::shared().dir().join("pki");
    let name = if next {
        "kube-dispatch-next"
    } else {
        "kube-dispatch"
    };
    kube_dispatch_server::tls::ServerTls::new(
        pki.join(format!("{name}.crt")),
        pki.join(format!("{name}.key")),
    )
}

/// The shared control plane of this test run.
#[derive(Debug)]
pub struct Cluster {
    root: PathBuf,
    kubeconfig: PathBuf,
    bin_dir: PathBuf,
}

static SHARED: OnceLock<Result<Cluster, String>> = OnceLock::new();

impl Cluster {
    /// Attaches to the running control plane, starting it with `tests/cluster/cluster.sh up` the
    /// first time this is called in a process if it is not running yet. It is left running when
    /// the tests end; `make cluster-down` stops it.
    ///
    /// # Panics
    ///
    /// Panics if the control plane cannot be started: no test against it could run.
    pub fn shared() -> &'static Cluster {
        let cluster = SHARED.get_or_init(|| {
            let root = repo_root();
            let kubeconfig = run_script(&root, &["up"]).map_err(|e| e.to_string())?;
            let bin_dir = run_script_file(&root, "build-binaries.sh", &["--print-dir"])
                .map_err(|e| e.to_string())?;
            Ok(Cluster {
                kubeconfig: PathBuf::from(kubeconfig.trim()),
                bin_dir: PathBuf::from(bin_dir.trim()),
                root,
            })
        });
        match cluster {
            Ok(cluster) => cluster,
            Err(e) => panic!("the test control plane is not available: {e}"),
        }
    }

    /// The folder the control plane lives in (`$KD_CLUSTER_DIR`, by default `.cluster`).
    pub fn dir(&self) -> &Path {
        self.kubeconfig.parent().unwrap_or(&self.root)
    }

    /// The admin kubeconfig (user `admin`, group `system:masters`).
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// The admin configuration from the kubeconfig.
    async fn config(&self) -> Result<Config, FixtureError> {
        let kubeconfig =
            Kubeconfig::read_from(&self.kubeconfig).map_err(|source| FixtureError::Kubeconfig {
                path: self.kubeconfig.clone(),
                source,
            })?;
        Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .map_err(|source| FixtureError::Kubeconfig {
                path: self.kubeconfig.clone(),
                source,
            })
    }

    /// A new admin client. Create one per test: a client is tied to the runtime it was made on.
    pub async fn client(&self) -> Result<Client, FixtureError> {
        Ok(Client::try_from(self.config().await?)?)
    }

    /// A new client that authenticates with the bearer `token` instead of the admin's, and
    /// retries answers 429, 503 and 504 (kube's default) when `retry`.
    pub async fn client_with_token(
        &self,
        token: &str,
        retry: bool,
    ) -> Result<Client, FixtureError> {
        let mut config = self.config().await?;
        config.auth_info = kube::config::AuthInfo {
            token: Some(token.to_owned().into()),
            ..kube::config::AuthInfo::default()
        };
        config.default_retry = retry;
        Ok(Client::try_from(config)?)
    }

    /// A new admin client that counts in `lists` the LISTs it makes of `resource` (a plural, as
    /// in the URL): what a controller reading through it asks the API server.
    pub async fn client_counting_lists(
        &self,
        resource: &'static str,
        lists: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    ) -> Result<Client, FixtureError> {
        use tonic::codegen::http;
        let suffix = format!("/{resource}");
        let count =
            tower::util::MapRequestLayer::new(move |request: http::Request<kube::client::Body>| {
                let watch = request
                    .uri()
                    .query()
                    .is_some_and(|q| q.contains("watch=true"));
                if request.method() == http::Method::GET
                    && request.uri().path().ends_with(&suffix)
                    && !watch
                {
                    lists.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                request
            });
        Ok(kube::client::ClientBuilder::try_from(self.config().await?)?
            .with_layer(&count)
            .build())
    }

    /// A new admin client that reaches the API server through `proxy` (a [`faultproxy`] in
    /// front of it): same TLS, another port.
    pub async fn client_via(&self, proxy: std::net::SocketAddr) -> Result<Client, FixtureError> {
        let mut config = self.config().await?;
        config.cluster_url = format!("https://{proxy}")
            .parse::<tonic::codegen::http::Uri>()
            .map_err(|e| FixtureError::Script {
                command: "proxy url".into(),
                detail: e.to_string(),
            })?;
        Ok(Client::try_from(config)?)
    }

    /// The API server's address.
    pub async fn apiserver_addr(&self) -> Result<std::net::SocketAddr, FixtureError> {
        let config = self.config().await?;
        let uri = &config.cluster_url;
        format!(
            "{}:{}",
            uri.host().unwrap_or("127.0.0.1"),
            uri.port_u16().unwrap_or(443)
        )
        .parse()
        .map_err(|e: std::net::AddrParseError| FixtureError::Script {
            command: "apiserver address".into(),
            detail: e.to_string(),
        })
    }

    /// Whether this API server applies `shardSelector` to LIST and WATCH: its
    /// `ShardedListAndWatch` feature gate is on, as its own `kubernetes_feature_enabled` metric
    /// reports (the gate exists from 1.36; `tests/cluster/cluster.sh` turns it on there).
    ///
    /// # Errors
    ///
    /// The `/metrics` request fails, or the server runs 1.36 or newer with the gate off although
    /// `KD_APISERVER_FEATURE_GATES` did not ask for that (the control plane is not the one the
    /// tests expect).
    pub async fn shards_lists_and_watches(&self) -> Result<bool, FixtureError> {
        use tonic::codegen::http;
        let client = self.client().await?;
        let request = http::Request::get("/metrics")
            .body(Vec::new())
            .map_err(|e| FixtureError::Timeout(format!("GET /metrics: {e}")))?;
        let metrics = client.request_text(request).await?;
        let on = metrics.lines().any(|line| {
            line.starts_with("kubernetes_feature_enabled{")
                && line.contains("name=\"ShardedListAndWatch\"")
                && line.ends_with(" 1")
        });
        let minor: u32 = client
            .apiserver_version()
            .await?
            .minor
            .trim_end_matches('+')
            .parse()
            .unwrap_or(0);
        if !on && minor >= 36 && std::env::var_os("KD_APISERVER_FEATURE_GATES").is_none() {
            return Err(FixtureError::Timeout(format!(
                "the API server (1.{minor}) runs without ShardedListAndWatch, which tests/cluster/cluster.sh turns on from 1.36: restart the control plane (make cluster-down)"
            )));
        }
        Ok(on)
    }

    /// A `kubectl` command, built from the pinned version, pointed at this cluster as admin.
    pub fn kubectl(&self) -> Command {
        let mut cmd = Command::new(self.bin_dir.join("kubectl"));
        cmd.arg("--kubeconfig").arg(&self.kubeconfig);
        cmd
    }

    /// Restarts kube-apiserver (etcd keeps running and keeps its data) and waits until it is
    /// ready again. Every open watch is cut. Other tests sharing the control plane see their
    /// requests fail for a few seconds, so only tests that run alone should call this.
    pub async fn restart_apiserver(&self) -> Result<(), FixtureError> {
        let root = self.root.clone();
        tokio::task::spawn_blocking(move || run_script(&root, &["restart-apiserver"]).map(drop))
            .await
            .map_err(|e| FixtureError::Script {
                command: "cluster.sh restart-apiserver".into(),
                detail: e.to_string(),
            })?
    }

    /// Restarts kube-apiserver so that every watch resuming afterwards gets 410 Gone, as in
    /// production: first a write no watch of `ns`'s ConfigMaps sees (a Secret) moves etcd past
    /// every resourceVersion they hold, then the restart starts the watch cache after it.
    /// (Without a write in between, the cache would start exactly where a quiet watch is, and
    /// the watch would resume without a 410.)
    pub async fn restart_apiserver_expiring_watches(
        &self,
        ns: &TestNamespace,
    ) -> Result<(), FixtureError> {
        use k8s_openapi::api::core::v1::Secret;
        let secrets: Api<Secret> = Api::namespaced(ns.client(), ns.name());
        let mut unseen = Secret::default();
        unseen.metadata.generate_name = Some("unseen-".into());
        secrets.create(&PostParams::default(), &unseen).await?;
        self.restart_apiserver().await
    }
}

fn repo_root() -> PathBuf {
    // This crate lives in <root>/tests.
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from(".."))
}

fn run_script(root: &Path, args: &[&str]) -> Result<String, FixtureError> {
    run_script_file(root, "cluster.sh", args)
}

fn run_script_file(root: &Path, script: &str, args: &[&str]) -> Result<String, FixtureError> {
    let path = root.join("tests/cluster").join(script);
    let command = format!("{} {}", path.display(), args.join(" "));
    let out = Command::new(&path)
        .args(args)
        .output()
        .map_err(|e| FixtureError::Script {
            command: command.clone(),
            detail: e.to_string(),
        })?;
    if !out.status.success() {
        return Err(FixtureError::Script {
            command,
            detail: format!(
                "{}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A test-only custom resource, `widgets.test.kube-dispatch.dev`.
#[derive(
    kube::CustomResource, serde::Serialize, serde::Deserialize, Clone, Debug, schemars::JsonSchema,
)]
#[kube(
    group = "test.kube-dispatch.dev",
    version = "v1",
    kind = "Widget",
    namespaced,
    status = "WidgetStatus"
)]
pub struct WidgetSpec {
    /// Any number.
    pub size: i64,
}

/// The status of a [`Widget`] (a subresource).
#[derive(serde::Serialize, serde::Deserialize, Clone, Debug, Default, schemars::JsonSchema)]
pub struct WidgetStatus {
    /// The size last seen by a controller.
    pub seen: i64,
}

/// How a subscription names the [`Widget`] kind (as a resource, or as the owner of owned
/// objects).
pub fn widget_ref() -> kube_dispatch_proto::v1::ResourceRef {
    kube_dispatch_proto::v1::ResourceRef {
        group: "test.kube-dispatch.dev".into(),
        version: "v1".into(),
        kind: "Widget".into(),
        plural: String::new(),
    }
}

/// Applies the Widget CRD and waits until it is established ([`ensure_crd`]).
pub async fn ensure_widget_crd(client: &Client) -> Result<(), FixtureError> {
    ensure_crd::<Widget>(client).await
}

/// Applies the CRD of `K` (idempotently: CRDs are cluster-scoped and shared by the whole run,
/// so it is never deleted) and waits until it is established.
pub async fn ensure_crd<K: kube::CustomResourceExt>(client: &Client) -> Result<(), FixtureError> {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::{
        ResourceExt,
        api::{Patch, PatchParams},
        runtime::{conditions, wait::await_condition},
    };
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd = K::crd();
    let name = crd.name_any();
    crds.patch(
        &name,
        &PatchParams::apply("kube-dispatch-tests").force(),
        &Patch::Apply(&crd),
    )
    .await?;
    let established = await_condition(crds, &name, conditions::is_crd_established());
    match tokio::time::timeout(Duration::from_secs(30), established).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(FixtureError::Script {
            command: format!("wait for CRD {name}"),
            detail: e.to_string(),
        }),
        Err(_) => Err(FixtureError::Script {
            command: format!("wait for CRD {name}"),
            detail: "not established within 30 s".into(),
        }),
    }
}

/// Sends the logs of the in-process components to the file `KD_TEST_LOG` names, if set (filter
/// from `RUST_LOG`, default `info`; each line names its component's thread), for reading what
/// led to a failure. Call at the start of a test; later calls in the same process do nothing.
pub fn log_to_file_from_env() {
    let Some(path) = std::env::var_os("KD_TEST_LOG") else {
        return;
    };
    let file = std::fs::File::create(&path)
        .unwrap_or_else(|e| panic!("KD_TEST_LOG={}: {e}", path.to_string_lossy()));
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_thread_names(true)
        .with_ansi(false)
        .with_writer(std::sync::Mutex::new(file))
        .try_init();
}

/// Resident memory of this process, in KiB (in-process dispatchers run in it); 0 where
/// `/proc` cannot be read.
pub fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// How often [`eventually`] asks.
const ASK_EVERY: Duration = Duration::from_millis(50);

/// How long the last ask of [`eventually`], at its deadline, may take.
const LAST_ASK: Duration = Duration::from_secs(1);

/// Asks `probe` every 50 ms until it answers `Some`, for at most `within`, and returns that
/// answer. An ask still running at the deadline is cut off, but the last one gets a second
/// however late it starts. `Err` says what was awaited and for how long, so that a regression
/// fails the test within its deadline, saying what did not happen, rather than hanging the
/// suite. New waits of a test for a state it cannot cause itself belong here (a few older loops
/// keep deadlines of their own). A probe that must not retry an error answers `Some(Err(..))`.
pub async fn eventually<T, F, Fut>(
    within: Duration,
    what: impl std::fmt::Display,
    mut probe: F,
) -> Result<T, FixtureError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let limit = deadline.max(tokio::time::Instant::now() + LAST_ASK);
        match tokio::time::timeout_at(limit, probe()).await {
            Ok(Some(t)) => return Ok(t),
            Ok(None) => {}
            Err(_) => break,
        }
        let now = tokio::time::Instant::now();
        if now >= deadline {
            break;
        }
        tokio::time::sleep(ASK_EVERY.min(deadline - now)).await;
    }
    Err(FixtureError::Timeout(format!(
        "{what}: not within {within:?}"
    )))
}

/// Waits until `condition` holds; see [`eventually`].
pub async fn wait_for<F, Fut>(
    timeout: Duration,
    what: &str,
    mut condition: F,
) -> Result<(), FixtureError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    eventually(timeout, what, || {
        let holds = condition();
        async move { holds.await.then_some(()) }
    })
    .await
}
