//! A namespace owned by one test, deleted (with everything in it) when dropped.

use std::{
    sync::atomic::{AtomicU32, Ordering},
    time::Duration,
};

use k8s_openapi::api::core::v1::Namespace;
use kube::{
    Api, Client,
    api::{DeleteParams, ObjectMeta, PostParams},
};

use crate::{Cluster, FixtureError};

/// A namespace owned by one test, deleted (with everything in it) when dropped.
pub struct TestNamespace {
    name: String,
    client: Client,
}

impl TestNamespace {
    /// Creates a namespace named `kd-<prefix>-<pid>-<n>` on the shared cluster, with an admin
    /// client for it. `prefix` should name the test; it is cut to keep the name valid.
    pub async fn create(prefix: &str) -> Result<Self, FixtureError> {
        Self::create_where(prefix, |_| true).await
    }

    /// As [`create`](Self::create), with the first name `accept` takes. A test whose keys must
    /// fall a certain way on a hash ring (which hashes the namespace too) states that here
    /// rather than hoping the process id gives it. Fails if none of the next 10 000 names does.
    pub async fn create_where(
        prefix: &str,
        accept: impl Fn(&str) -> bool,
    ) -> Result<Self, FixtureError> {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        const TRIES: usize = 10_000;
        let client = Cluster::shared().client().await?;
        let prefix: String = prefix
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() {
                    c.to_ascii_lowercase()
                } else {
                    '-'
                }
            })
            .take(40)
            .collect();
        let prefix = prefix.trim_matches('-');
        let pid = std::process::id();
        let name = std::iter::repeat_with(|| {
            let n = COUNTER.fetch_add(1, Ordering::Relaxed);
            format!("kd-{prefix}-{pid}-{n}")
        })
        .take(TRIES)
        .find(|name| accept(name))
        .ok_or_else(|| {
            FixtureError::Timeout(format!(
                "no namespace name kd-{prefix}-{pid}-<n> of the next {TRIES} suits the test"
            ))
        })?;
        let namespaces: Api<Namespace> = Api::all(client.clone());
        let ns = Namespace {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                labels: Some([("kube-dispatch.dev/test".to_owned(), "true".to_owned())].into()),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        };
        namespaces.create(&PostParams::default(), &ns).await?;
        Ok(Self { name, client })
    }

    /// The namespace's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// An admin client (cheap to clone).
    pub fn client(&self) -> Client {
        self.client.clone()
    }

    /// Deletes the namespace and waits, up to `timeout`, until the namespace controller has
    /// emptied and removed it: its requests (a LIST of every resource in it) are then over,
    /// and cannot fall into what a benchmark counts next.
    pub async fn delete_and_wait(mut self, timeout: Duration) -> Result<(), FixtureError> {
        let name = std::mem::take(&mut self.name);
        let namespaces: Api<Namespace> = Api::all(self.client.clone());
        let uid = namespaces
            .get(&name)
            .await?
            .metadata
            .uid
            .unwrap_or_default();
        namespaces
            .delete(&name, &DeleteParams::background())
            .await?;
        let gone = kube::runtime::wait::await_condition(
            namespaces,
            &name,
            kube::runtime::wait::conditions::is_deleted(&uid),
        );
        match tokio::time::timeout(timeout, gone).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(FixtureError::Timeout(format!(
                "waiting for namespace {name} to go: {e}"
            ))),
            Err(_) => Err(FixtureError::Timeout(format!(
                "namespace {name} still there after {timeout:?}"
            ))),
        }
    }
}

impl std::fmt::Debug for TestNamespace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestNamespace")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        if std::env::var_os("KD_KEEP_NAMESPACES").is_some() {
            eprintln!(
                "keeping test namespace {} (KD_KEEP_NAMESPACES is set)",
                self.name
            );
            return;
        }
        // Deleted already (delete_and_wait).
        if self.name.is_empty() {
            return;
        }
        // Drop cannot await, and the test's runtime may be shutting down: delete from a thread
        // with a runtime of its own, and wait for the request (not for the namespace controller
        // to finish emptying it).
        let name = std::mem::take(&mut self.name);
        let deleted = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build();
            let Ok(runtime) = runtime else { return };
            runtime.block_on(async {
                let Ok(client) = Cluster::shared().client().await else {
                    return;
                };
                let namespaces: Api<Namespace> = Api::all(client);
                let params = DeleteParams::background();
                let delete = namespaces.delete(&name, &params);
                if let Ok(Err(e)) = tokio::time::timeout(Duration::from_secs(10), delete).await {
                    eprintln!("could not delete test namespace {name}: {e}");
                }
            });
        });
        let _ = deleted.join();
    }
}
