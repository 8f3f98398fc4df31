//! Finalizers as kube-runtime writes them, returning the SDK's [`Action`].
//!
//! kube-runtime's `finalizer()` runs a reconcile as [`Event::Apply`] or [`Event::Cleanup`]:
//! it adds the finalizer before the first `Apply`, and removes it once a `Cleanup` succeeds, so
//! the object is not deleted before the controller has cleaned up after it. Its closure must
//! return kube-runtime's own `Action`, which is not the SDK's. This module's [`finalizer`] takes
//! and returns the SDK's [`Action`] and is otherwise kube-runtime's: it calls kube-runtime's
//! function, so the finalizer is added and removed by the same JSON patches (with their test
//! operations), and its [`Event`] and [`Error`] are kube-runtime's types. A kube-rs controller
//! that uses finalizers ports by changing its imports:
//!
//! ```diff
//! -use kube::runtime::{controller::Action, finalizer::{finalizer, Event}};
//! +use kube_dispatch_controller::{Action, finalizer::{finalizer, Event}};
//! ```
//!
//! ```no_run
//! # use std::{sync::Arc, time::Duration};
//! # use k8s_openapi::api::core::v1::ConfigMap;
//! # use kube::{Api, ResourceExt};
//! use kube_dispatch_controller::{
//!     Action,
//!     finalizer::{self, Event, finalizer},
//! };
//!
//! async fn reconcile(
//!     cm: Arc<ConfigMap>,
//!     client: kube::Client,
//! ) -> Result<Action, finalizer::Error<kube::Error>> {
//!     let api: Api<ConfigMap> = Api::namespaced(client, &cm.namespace().unwrap_or_default());
//!     finalizer(&api, "example.com/cleanup", cm, |event| async move {
//!         match event {
//!             Event::Apply(_cm) => Ok(Action::requeue(Duration::from_secs(300))),
//!             // Release what the object held outside the cluster, then let it go.
//!             Event::Cleanup(_cm) => Ok::<_, kube::Error>(Action::await_change()),
//!         }
//!     })
//!     .await
//! }
//! ```
//!
//! In the tier the patch that adds the finalizer changes the object, so its key is delivered
//! again and that reconcile runs `Apply`, as a kube-rs watch would see it.

use std::{error::Error as StdError, fmt::Debug, sync::Arc};

use futures::{TryFuture, TryFutureExt as _};
pub use kube::runtime::finalizer::{Error, Event};
use kube::{Api, Resource};
use serde::{Serialize, de::DeserializeOwned};

use crate::Action;

/// Runs `reconcile` behind the finalizer `finalizer_name` on `obj`, as kube-runtime's
/// `finalizer()` does, with the SDK's [`Action`].
///
/// Where kube-runtime runs no reconcile (it adds the finalizer, or the object is going and the
/// finalizer is not on it), the action is [`Action::await_change`], as kube-runtime's is.
pub async fn finalizer<K, ReconcileFut>(
    api: &Api<K>,
    finalizer_name: &str,
    obj: Arc<K>,
    reconcile: impl FnOnce(Event<K>) -> ReconcileFut,
) -> Result<Action, Error<ReconcileFut::Error>>
where
    K: Resource + Clone + DeserializeOwned + Serialize + Debug,
    ReconcileFut: TryFuture<Ok = Action>,
    ReconcileFut::Error: StdError + 'static,
{
    let mut chosen = None;
    let slot = &mut chosen;
    kube::runtime::finalizer(api, finalizer_name, obj, move |event| {
        reconcile(event).map_ok(move |action| {
            *slot = Some(action);
            kube::runtime::controller::Action::from(action)
        })
    })
    .await?;
    Ok(chosen.unwrap_or_else(Action::await_change))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::client::Body;

    use super::*;

    const NAME: &str = "example.com/cleanup";

    /// An `Api` whose every call fails: what kube-runtime writes, it writes through this.
    fn unreachable_api() -> Api<ConfigMap> {
        let service = tower::service_fn(|_: http::Request<Body>| async {
            Err::<http::Response<Body>, _>(std::io::Error::other("no API server in this test"))
        });
        Api::namespaced(kube::Client::new(service, "default"), "default")
    }

    fn config_map(finalizer: bool, deleting: bool) -> Arc<ConfigMap> {
        let mut cm = ConfigMap::default();
        cm.metadata.name = Some("guarded".into());
        cm.metadata.namespace = Some("default".into());
        if finalizer {
            cm.metadata.finalizers = Some(vec![NAME.into()]);
        }
        if deleting {
            cm.metadata.deletion_timestamp =
                Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
                ));
        }
        Arc::new(cm)
    }

    async fn run(cm: Arc<ConfigMap>) -> Result<Action, Error<kube::Error>> {
        finalizer(&unreachable_api(), NAME, cm, |event| async move {
            match event {
                Event::Apply(_) => Ok(Action::requeue(Duration::from_secs(7))),
                Event::Cleanup(_) => Ok(Action::requeue(Duration::from_secs(9))),
            }
        })
        .await
    }

    #[tokio::test]
    async fn the_reconciles_action_comes_back_and_the_finalizer_is_written_by_kube_runtime() {
        // The finalizer in place: the reconcile runs as Apply, with no write, and its action is
        // the result.
        assert_eq!(
            run(config_map(true, false)).await.ok(),
            Some(Action::requeue(Duration::from_secs(7)))
        );
        // Not in place: kube-runtime adds it (here the write fails) before any Apply.
        assert!(matches!(
            run(config_map(false, false)).await,
            Err(Error::AddFinalizer(_))
        ));
        // Going, with the finalizer: Cleanup runs, then kube-runtime removes the finalizer
        // (here the write fails, so the cleanup's action is not the result).
        assert!(matches!(
            run(config_map(true, true)).await,
            Err(Error::RemoveFinalizer(_))
        ));
        // Going, without it: nothing to do.
        assert_eq!(
            run(config_map(false, true)).await.ok(),
            Some(Action::await_change())
        );
    }
}
