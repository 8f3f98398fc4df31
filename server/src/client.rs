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

/// `client` for token and access reviews: [`with_requests_in_flight`] with
/// [`REVIEWS_IN_FLIGHT`]. Each process makes one and shares it among its reviewers.
pub fn for_reviews(client: kube::Client) -> kube::Client {
    with_requests_in_flight(client, REVIEWS_IN_FLIGHT)
}

/// `client`, letting at most `most` requests wait for their answer at once, each at most
/// [`TURN_TIMEOUT`]; the others wait for a turn, first come first served. Clones of the client
/// returned share the turns.
pub fn with_requests_in_flight(client: kube::Client, most: usize) -> kube::Client {
    let namespace = client.default_namespace().to_owned();
    let service = tower::ServiceBuilder::new()
        .concurrency_limit(most)
        .timeout(TURN_TIMEOUT)
        .service_fn(move |request: http::Request<kube::client::Body>| {
            let client = client.clone();
            async move { client.send(request).await }
        });
    kube::Client::new(service, namespace)
}

#[cfg(test)]
mod tests {
    use std::{
        sync::{
            Arc,
            atomic::{AtomicUsize, Ordering::SeqCst},
        },
        time::Duration,
    };

    use kube::client::Body;
    use tokio::{sync::Semaphore, task::JoinSet};

    use super::*;

    /// An API server that answers a request only once the test gives it an answer, counting
    /// the requests that reached it and those waiting there now.
    #[derive(Clone)]
    struct ApiServer {
        arrived: Arc<AtomicUsize>,
        in_flight: Arc<AtomicUsize>,
        most_seen: Arc<AtomicUsize>,
        answers: Arc<Semaphore>,
    }

    /// Counts a request in flight until it is answered or given up.
    struct InFlight(Arc<AtomicUsize>);

    impl Drop for InFlight {
        fn drop(&mut self) {
            self.0.fetch_sub(1, SeqCst);
        }
    }

    impl ApiServer {
        fn new() -> Self {
            Self {
                arrived: Arc::default(),
                in_flight: Arc::default(),
                most_seen: Arc::default(),
                answers: Arc::new(Semaphore::new(0)),
            }
        }

        fn client(&self) -> kube::Client {
            let server = self.clone();
            let service = tower::service_fn(move |_: http::Request<Body>| {
                let server = server.clone();
                async move {
                    server.arrived.fetch_add(1, SeqCst);
                    let now = server.in_flight.fetch_add(1, SeqCst) + 1;
                    let _counted = InFlight(server.in_flight.clone());
                    server.most_seen.fetch_max(now, SeqCst);
                    server
                        .answers
                        .acquire()
                        .await
                        .expect("never closed")
                        .forget();
                    Ok::<_, std::convert::Infallible>(http::Response::new(Body::empty()))
                }
            });
            kube::Client::new(service, "default")
        }
    }

    /// `calls` requests through `client`, each on a task of its own.
    fn call(client: &kube::Client, calls: usize) -> JoinSet<Result<http::StatusCode, kube::Error>> {
        let mut set = JoinSet::new();
        for _ in 0..calls {
            let client = client.clone();
            set.spawn(async move {
                let request = http::Request::get("/apis/x").body(Body::empty());
                client
                    .send(request.expect("a request"))
                    .await
                    .map(|r| r.status())
            });
        }
        set
    }

    /// Returns once every task has run as far as it can: with the clock paused, a timer fires
    /// only when nothing else is ready to run.
    async fn settled() {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn requests_past_the_most_in_flight_wait_their_turn() {
        let api_server = ApiServer::new();
        let mut calls = call(&with_requests_in_flight(api_server.client(), 2), 5);
        settled().await;
        assert_eq!(
            api_server.in_flight.load(SeqCst),
            2,
            "two calls reach the API server, three wait"
        );
        api_server.answers.add_permits(5);
        while let Some(answered) = calls.join_next().await {
            assert_eq!(
                answered.expect("a call").expect("an answer"),
                http::StatusCode::OK
            );
        }
        assert_eq!(
            api_server.most_seen.load(SeqCst),
            2,
            "never more than two at once"
        );
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn a_request_unanswered_past_its_deadline_fails_and_gives_its_turn() {
        let api_server = ApiServer::new();
        let client = with_requests_in_flight(api_server.client(), 1);
        let mut first = call(&client, 1);
        settled().await;
        let mut second = call(&client, 1);
        settled().await;
        assert_eq!(
            api_server.arrived.load(SeqCst),
            1,
            "the second waits its turn"
        );
        tokio::time::sleep(TURN_TIMEOUT).await;
        settled().await;
        let failed = first
            .try_join_next()
            .expect("given up at the deadline")
            .expect("no panic");
        assert!(
            failed.is_err(),
            "unanswered within {TURN_TIMEOUT:?}: {failed:?}"
        );
        settled().await;
        assert_eq!(
            api_server.arrived.load(SeqCst),
            2,
            "the second had its turn"
        );
        api_server.answers.add_permits(1);
        let answered = second.join_next().await.expect("a call").expect("no panic");
        assert_eq!(answered.expect("an answer"), http::StatusCode::OK);
    }
}
