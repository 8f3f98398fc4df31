//! The Kubernetes client, from a kubeconfig flag or the environment.

use anyhow::Context as _;

/// A Kubernetes client from `kubeconfig`; else from the files `KUBECONFIG` names, read as
/// kubectl reads the variable (a list of files merged, empty as unset); else from
/// `~/.kube/config`, or the in-cluster configuration when that is missing.
///
/// A `KUBECONFIG` that names a file that cannot be read is an error, never a fall back to the
/// in-cluster configuration: a mistyped or unmounted kubeconfig must not send a process in a
/// pod to the pod's own cluster.
pub async fn from_kubeconfig(kubeconfig: Option<&std::path::Path>) -> anyhow::Result<kube::Client> {
    let named = match kubeconfig {
        Some(path) => Some((
            kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("cannot read kubeconfig {}", path.display()))?,
            path.display().to_string(),
        )),
        None => {
            let listed = std::env::var_os("KUBECONFIG").unwrap_or_default();
            let listed = listed.to_string_lossy();
            kube::config::Kubeconfig::from_env()
                .with_context(|| format!("cannot read KUBECONFIG {listed}"))?
                .map(|kc| (kc, format!("KUBECONFIG {listed}")))
        }
    };
    let config = match named {
        Some((kc, from)) => kube::Config::from_custom_kubeconfig(kc, &Default::default())
            .await
            .with_context(|| format!("invalid kubeconfig ({from})"))?,
        None => kube::Config::infer().await.context(
            "no kubeconfig (--kubeconfig, KUBECONFIG or ~/.kube/config) and no in-cluster \
             configuration",
        )?,
    };
    kube::Client::try_from(config).context("cannot build the Kubernetes client")
}

/// Most review requests (TokenReviews and SubjectAccessReviews) one process has in flight to
/// the API server at once; the others wait their turn. Each request in flight holds a
/// connection of its own (the client speaks HTTP/1.1), so this is also about the most
/// connections reviews open: without it a reconnect storm (a thousand replicas reconnecting,
/// each with a new token) opened about 350 connections to the API server within two seconds,
/// each a TLS handshake it had to serve beside the cluster's own requests. A review takes a
/// few milliseconds, so 16 at once review thousands of tokens a second, more than
/// `--max-token-review-rate` lets through.
pub const REVIEWS_IN_FLIGHT: usize = 16;

/// Longest a request given a turn by [`with_requests_in_flight`] waits for its answer before it
/// fails (and gives its turn to the next): an API server that stopped answering must not hold
/// every turn.
pub const TURN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// `client`, letting at most `most` requests wait for their answer at once, each at most
/// [`TURN_TIMEOUT`]; the others wait for a turn, first come first served. Clones of the client
/// returned share the turns.
pub fn with_requests_in_flight(client: kube::Client, most: usize) -> kube::Client {
    let namespace = client.default_namespace().to_owned();
    let turns = std::sync::Arc::new(tokio::sync::Semaphore::new(most));
    let service = tower::service_fn(move |request: http::Request<kube::client::Body>| {
        let (client, turns) = (client.clone(), turns.clone());
        async move {
            // The semaphore is never closed.
            let _turn = turns.acquire_owned().await;
            match tokio::time::timeout(TURN_TIMEOUT, client.send(request)).await {
                Ok(answered) => answered.map_err(tower::BoxError::from),
                Err(_) => Err(format!(
                    "no answer from the API server within {} s",
                    TURN_TIMEOUT.as_secs()
                )
                .into()),
            }
        }
    });
    kube::Client::new(service, namespace)
}

#[cfg(test)]
mod tests {
    use std::sync::{
        Arc,
        atomic::{AtomicUsize, Ordering::SeqCst},
    };

    use kube::client::Body;

    use super::*;

    #[tokio::test(flavor = "current_thread")]
    async fn requests_past_the_most_in_flight_wait_their_turn() {
        let in_flight = Arc::new(AtomicUsize::new(0));
        let most_seen = Arc::new(AtomicUsize::new(0));
        // The API server answers only once the test lets it.
        let answers = Arc::new(tokio::sync::Semaphore::new(0));
        let api_server = {
            let (in_flight, most_seen, answers) =
                (in_flight.clone(), most_seen.clone(), answers.clone());
            tower::service_fn(move |_: http::Request<Body>| {
                let (in_flight, most_seen, answers) =
                    (in_flight.clone(), most_seen.clone(), answers.clone());
                async move {
                    let now = in_flight.fetch_add(1, SeqCst) + 1;
                    most_seen.fetch_max(now, SeqCst);
                    answers.acquire().await.expect("never closed").forget();
                    in_flight.fetch_sub(1, SeqCst);
                    Ok::<_, std::convert::Infallible>(http::Response::new(Body::empty()))
                }
            })
        };
        let client = with_requests_in_flight(kube::Client::new(api_server, "default"), 2);
        let mut calls = tokio::task::JoinSet::new();
        for _ in 0..5 {
            let client = client.clone();
            calls.spawn(async move {
                let request = http::Request::get("/apis/x").body(Body::empty());
                client
                    .send(request.expect("a request"))
                    .await
                    .map(|r| r.status())
            });
        }
        // On this one thread, every call runs as far as it can before the test goes on.
        for _ in 0..200 {
            tokio::task::yield_now().await;
        }
        assert_eq!(
            in_flight.load(SeqCst),
            2,
            "two calls reach the API server, three wait"
        );
        answers.add_permits(5);
        while let Some(answered) = calls.join_next().await {
            assert_eq!(
                answered.expect("a call").expect("an answer"),
                http::StatusCode::OK
            );
        }
        assert_eq!(most_seen.load(SeqCst), 2, "never more than two at once");
    }
}
