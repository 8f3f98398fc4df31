//! The tower layer that authenticates each call to a kube-dispatch server ([`AuthLayer`]): it
//! puts the [`Caller`] on the request, or answers with the status the reason calls for; the
//! health service's calls pass without a credential, within a budget of their own.
//!
//! Written as a layer of its own rather than on tower-http's `AsyncRequireAuthorizationLayer`:
//! a health call holds its place in the budget until its response body ends (a `Health/Watch`
//! stream keeps it), which that layer, passing responses through untouched, cannot express.

use std::{
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use http_body_util::BodyExt as _;
use tokio::sync::Semaphore;
use tonic::{Status, body::Body, transport::server::TcpConnectInfo};
use tracing::warn;

use super::{error::Unauthenticated, identity::Caller, token_review::Authenticator};
use crate::bounds::{Connections, Refusals, ServerLimits};

/// Paths no credential is asked for: the health service, which the kubelet's probes call.
const UNAUTHENTICATED_PREFIXES: &[&str] = &["/grpc.health.v1.Health/"];

/// How a server authenticates its callers.
#[derive(Clone, Debug)]
pub enum Authentication {
    /// Every call but health checks needs a token that passes review.
    Required(Arc<Authenticator>),
    /// Nobody is checked and every caller is [`Caller::Anonymous`]: only behind an explicit
    /// flag, which logs a warning at start.
    Anonymous,
}

impl Authentication {
    /// Logs, once at start, that a server takes anonymous calls.
    pub fn warn_if_anonymous(&self, server: &str) {
        if matches!(self, Authentication::Anonymous) {
            warn!(
                server,
                "authentication OFF (--allow-anonymous): any caller that reaches this port reads every object the dispatchers can read and can act in any controller group"
            );
        }
    }
}

/// A tower layer that authenticates every request but health checks, holds each identity to its
/// request rate (RESOURCE_EXHAUSTED past it), and puts its [`Caller`] in the request's
/// extensions. Health checks, which carry no credential, share a budget of their own
/// ([`ServerLimits::max_unauthenticated_calls`]) held until their answer ends, streams included.
#[derive(Clone, Debug)]
pub struct AuthLayer {
    authentication: Authentication,
    unauthenticated: Arc<Semaphore>,
    refusals: Refusals,
    /// Told of each peer that authenticates a call ([`AuthLayer::vouching`]).
    connections: Option<Arc<Connections>>,
}

impl AuthLayer {
    /// Authenticates as `authentication` says, within `limits`; refusals counted in `refusals`.
    pub fn new(authentication: Authentication, limits: &ServerLimits, refusals: Refusals) -> Self {
        Self {
            authentication,
            unauthenticated: Arc::new(Semaphore::new(limits.max_unauthenticated_calls)),
            refusals,
            connections: None,
        }
    }

    /// Tells `connections` of each peer address that authenticates a call, so its next
    /// connections may take the places reserved for known peers ([`Connections::vouch`]).
    #[must_use]
    pub fn vouching(mut self, connections: Arc<Connections>) -> Self {
        self.connections = Some(connections);
        self
    }
}

impl<S> tower::Layer<S> for AuthLayer {
    type Service = Authenticate<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Authenticate {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service [`AuthLayer`] makes.
#[derive(Clone, Debug)]
pub struct Authenticate<S> {
    inner: S,
    layer: AuthLayer,
}

type BoxFuture<T> = Pin<Box<dyn std::future::Future<Output = T> + Send>>;

impl<S> tower::Service<http::Request<Body>> for Authenticate<S>
where
    S: tower::Service<http::Request<Body>, Response = http::Response<Body>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<Body>) -> Self::Future {
        // The clone that was made ready is the one that serves this call.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let layer = self.layer.clone();
        Box::pin(async move {
            let peer = request
                .extensions()
                .get::<TcpConnectInfo>()
                .and_then(TcpConnectInfo::remote_addr)
                .map(|a| a.ip());
            let path = request.uri().path();
            if UNAUTHENTICATED_PREFIXES.iter().any(|p| path.starts_with(p)) {
                let Ok(permit) = layer.unauthenticated.clone().try_acquire_owned() else {
                    let who = peer.map_or_else(|| "unknown".to_owned(), |p| p.to_string());
                    layer.refusals.refused(
                        "unauthenticated_calls",
                        &who,
                        "calls without a credential (health) are at their bound",
                    );
                    return Ok(Status::resource_exhausted(
                        "this server takes only so many calls without a credential (health checks) at once; retry",
                    )
                    .into_http());
                };
                request.extensions_mut().insert(Caller::Anonymous);
                let response = inner.call(request).await?;
                // Held until the answer ends: a Health/Watch stream keeps its place.
                return Ok(response.map(|body| {
                    Body::new(body.map_frame(move |frame| {
                        let _held = &permit;
                        frame
                    }))
                }));
            }
            let caller = match &layer.authentication {
                Authentication::Anonymous => Caller::Anonymous,
                Authentication::Required(authenticator) => {
                    let header = request
                        .headers()
                        .get(http::header::AUTHORIZATION)
                        .map(|v| v.as_bytes());
                    let identity = match authenticator.authenticate(header, peer).await {
                        Ok(identity) => identity,
                        Err(e) => {
                            if let Unauthenticated::FailingPeer { peer, .. } = &e {
                                layer.refusals.refused(
                                    "failed_authentications_per_peer",
                                    peer,
                                    &e.to_string(),
                                );
                            }
                            return Ok(Status::from(e).into_http());
                        }
                    };
                    if let Err(e) = authenticator.admit(&identity) {
                        layer
                            .refusals
                            .refused("request_rate", &identity.username, &e.to_string());
                        return Ok(Status::resource_exhausted(e.to_string()).into_http());
                    }
                    if let (Some(connections), Some(peer)) = (&layer.connections, peer) {
                        connections.vouch(peer);
                    }
                    Caller::Authenticated(identity)
                }
            };
            request.extensions_mut().insert(caller);
            inner.call(request).await
        })
    }
}
