//! Who is calling: every call to a kube-dispatch server carries a Kubernetes ServiceAccount
//! token as `authorization: Bearer <token>`; [`Authenticator`] verifies it with a TokenReview for
//! the expected audiences and [`AuthLayer`] puts the caller's [`Identity`] on the request (or
//! answers UNAUTHENTICATED with a message that says what is wrong, never the token).
//!
//! Reviews are cached in a bounded map keyed by the token's SHA-256: a verdict is kept at most
//! [`AuthConfig::cache_ttl`] (a refusal [`AuthConfig::refusal_ttl`], in a map of its own so
//! refusals never push out verdicts) and never past the token's own expiry, and one review per
//! token is in flight at a time, so the API server sees a review per token and period, not per
//! call.
//!
//! Reviews cannot be starved by a flood of bad tokens:
//!
//! - a token that cannot pass is refused without a review: not a JWT (every ServiceAccount token
//!   is one), expired, or for none of the accepted audiences;
//! - a token verified before is reviewed again, when its verdict ages out, ahead of the budget
//!   of new tokens ([`AuthConfig::review_rate`]), which only tokens never verified spend;
//! - a peer address whose tokens failed review is held to
//!   [`AuthConfig::failures_per_peer`] further reviews of new tokens, while other peers are
//!   reviewed as before.

use std::{
    collections::{BTreeMap, HashMap},
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use base64::Engine as _;
use k8s_openapi::api::authentication::v1::{
    SelfSubjectReview, TokenReview, TokenReviewSpec, UserInfo,
};
use kube::{Api, Client, api::PostParams};
use sha2::{Digest, Sha256};
use tonic::{Status, body::Body};
use tracing::warn;

use http_body_util::BodyExt as _;
use tokio::sync::Semaphore;
use tonic::transport::server::TcpConnectInfo;

use crate::{
    bounds::{Refusals, ServerLimits},
    limits::{RateExceeded, RateLimits, RequestRate},
};

/// Paths no credential is asked for: the health service, which the kubelet's probes call.
const UNAUTHENTICATED_PREFIXES: &[&str] = &["/grpc.health.v1.Health/"];

/// The authenticated caller of a request.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Identity {
    /// The Kubernetes user name (`system:serviceaccount:<namespace>:<name>` for a
    /// ServiceAccount).
    pub username: String,
    /// The user's uid, when the authenticator gives one.
    pub uid: String,
    /// The user's groups.
    pub groups: Vec<String>,
    /// Extra attributes (for ServiceAccount tokens: the pod and node bound to it), which
    /// SubjectAccessReviews pass on.
    pub extra: BTreeMap<String, Vec<String>>,
}

impl Identity {
    fn from_user(user: UserInfo) -> Self {
        Self {
            username: user.username.unwrap_or_default(),
            uid: user.uid.unwrap_or_default(),
            groups: user.groups.unwrap_or_default(),
            extra: user.extra.unwrap_or_default(),
        }
    }
}

/// Who is calling, as [`AuthLayer`] puts it on every request it lets through.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Caller {
    /// A verified identity.
    Authenticated(Arc<Identity>),
    /// Nobody checked: the server runs with authentication off (`--allow-anonymous`).
    Anonymous,
}

impl Caller {
    /// The caller of `request`; a request that did not pass through [`AuthLayer`] (a test that
    /// calls a service directly) is anonymous.
    pub fn of<T>(request: &tonic::Request<T>) -> Self {
        request
            .extensions()
            .get::<Caller>()
            .cloned()
            .unwrap_or(Caller::Anonymous)
    }

    /// The identity, if authenticated.
    pub fn identity(&self) -> Option<&Arc<Identity>> {
        match self {
            Caller::Authenticated(identity) => Some(identity),
            Caller::Anonymous => None,
        }
    }

    /// The user name for logs and errors: `anonymous` when nobody checked.
    pub fn name(&self) -> &str {
        match self {
            Caller::Authenticated(identity) => &identity.username,
            Caller::Anonymous => "anonymous",
        }
    }
}

/// A controller group used by a user not listed for it (`--group-owner`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "group {group:?} is listed with --group-owner for {owner}, not {caller}: run the controller as one of them, or pick another group name"
)]
pub struct NotOwner {
    /// The group.
    pub group: String,
    /// The users listed for it, joined by `or`.
    pub owner: String,
    /// The caller.
    pub caller: String,
}

/// A controller group as the tier keys it: its name and the user it belongs to. Groups are
/// scoped by identity: one name used by two users is two groups, so no user can take, join or
/// squat another's group, on any dispatcher or load balancer, before or after a restart or a
/// failover, and nothing about ownership needs remembering.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GroupId {
    /// The name every replica of the controller sends.
    pub name: String,
    /// The user the group belongs to; `None` for a group listed with `--group-owner` (shared
    /// by the users listed) and when nobody is authenticated.
    pub owner: Option<String>,
}

impl GroupId {
    /// A group nobody owns: listed with `--group-owner`, or authentication off.
    pub fn shared(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            owner: None,
        }
    }
}

impl std::fmt::Display for GroupId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.owner {
            Some(owner) => write!(f, "{} (of {owner})", self.name),
            None => f.write_str(&self.name),
        }
    }
}

/// Who may use a controller group. By default each user has groups of its own
/// ([`GroupId`]); a group an operator listed (`--group-owner GROUP=USER`, repeated) is one
/// group shared by exactly the users listed: for a controller that runs under several
/// ServiceAccounts, during a migration from one to another say.
#[derive(Clone, Debug, Default)]
pub struct GroupOwners(Arc<HashMap<String, Vec<String>>>);

impl GroupOwners {
    /// The users listed for each group, from `(group, user)` pairs.
    pub fn from_pairs(pairs: impl IntoIterator<Item = (String, String)>) -> Self {
        let mut owners: HashMap<String, Vec<String>> = HashMap::new();
        for (group, user) in pairs {
            let users = owners.entry(group).or_default();
            if !users.contains(&user) {
                users.push(user);
            }
        }
        Self(Arc::new(owners))
    }

    /// Whether no group is listed.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The group `caller` (`None`: anonymous) means by `group`: its own, unless the name is
    /// listed, and then the shared one if `caller` is listed for it.
    pub fn group_id(&self, group: &str, caller: Option<&str>) -> Result<GroupId, NotOwner> {
        if let Some(listed) = self.0.get(group) {
            return match caller {
                Some(caller) if listed.iter().any(|u| u == caller) => Ok(GroupId::shared(group)),
                _ => Err(NotOwner {
                    group: group.to_owned(),
                    owner: listed.join(" or "),
                    caller: caller.unwrap_or("anonymous").to_owned(),
                }),
            };
        }
        Ok(GroupId {
            name: group.to_owned(),
            owner: caller.map(str::to_owned),
        })
    }
}

/// Settings of the authenticator. The defaults are the binaries' flags' defaults.
#[derive(Clone, Debug)]
pub struct AuthConfig {
    /// A token must be valid for one of these audiences.
    pub audiences: Vec<String>,
    /// Longest a verified token is trusted without a new review.
    pub cache_ttl: Duration,
    /// Longest a refused token is refused without a new review.
    pub refusal_ttl: Duration,
    /// Most tokens remembered at once; about 300 bytes each. Also the most identities whose
    /// request rate is tracked.
    pub cache_capacity: u64,
    /// How fast each identity may call this server.
    pub rate: RequestRate,
    /// How many tokens never verified may be reviewed per second (TokenReview), over all
    /// callers: a caller sending a new garbage token on every call cannot make this server
    /// flood the API server with reviews. Past it, calls with new tokens get UNAVAILABLE
    /// (retry); tokens verified before are reviewed again outside this budget.
    pub review_rate: RequestRate,
    /// Reviews of new tokens one peer address may ask for once a token of it failed review.
    pub failures_per_peer: RequestRate,
}

impl Default for AuthConfig {
    fn default() -> Self {
        Self {
            audiences: vec![kube_dispatch_proto::credentials::DEFAULT_AUDIENCE.to_owned()],
            cache_ttl: Duration::from_secs(120),
            refusal_ttl: Duration::from_secs(10),
            cache_capacity: 10_000,
            rate: RequestRate::default(),
            review_rate: RequestRate {
                per_second: std::num::NonZeroU32::new(50).expect("non-zero"),
                burst: std::num::NonZeroU32::new(100).expect("non-zero"),
            },
            failures_per_peer: RequestRate {
                per_second: std::num::NonZeroU32::new(1).expect("non-zero"),
                burst: std::num::NonZeroU32::new(10).expect("non-zero"),
            },
        }
    }
}

/// Why a call was not authenticated; each says what is wrong and none holds the token.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Unauthenticated {
    /// No `authorization` header.
    #[error(
        "no credential: send `authorization: Bearer <token>` with a ServiceAccount token for audience {audiences}"
    )]
    Missing {
        /// The audiences accepted.
        audiences: String,
    },
    /// A header that is not `Bearer <token>`.
    #[error("malformed credential: {0}")]
    Malformed(&'static str),
    /// A token that is not a JWT, as every ServiceAccount token is.
    #[error(
        "the bearer token is not a JWT: send a projected ServiceAccount token for audience {0}"
    )]
    NotAJwt(String),
    /// A peer whose tokens failed review, over its budget of further reviews.
    #[error(
        "too many failed authentications from {peer}: new tokens from it are reviewed at most {per_second} per second (bursts of {burst}); retry in {retry_after:?}"
    )]
    FailingPeer {
        /// The peer address.
        peer: String,
        /// Reviews per second allowed.
        per_second: u32,
        /// Reviews at once allowed.
        burst: u32,
        /// When the next review would be made.
        retry_after: Duration,
    },
    /// The token's `exp` claim has passed.
    #[error("token expired {0} s ago: the kubelet rotates projected tokens; read the file again")]
    Expired(u64),
    /// The token's `aud` claim names none of the accepted audiences.
    #[error("token is for audiences {got:?}, not {want}: project it with `audience: {want}`")]
    WrongAudience {
        /// The token's audiences.
        got: Vec<String>,
        /// The audiences accepted.
        want: String,
    },
    /// The API server did not authenticate the token.
    #[error("token rejected by the API server: {0}")]
    Rejected(String),
    /// The review could not be made; the call may be retried.
    #[error("cannot verify the token now: {0}")]
    Unavailable(String),
}

impl From<Unauthenticated> for Status {
    fn from(e: Unauthenticated) -> Self {
        match e {
            Unauthenticated::Unavailable(_) => Status::unavailable(e.to_string()),
            Unauthenticated::FailingPeer { .. } => Status::resource_exhausted(e.to_string()),
            _ => Status::unauthenticated(e.to_string()),
        }
    }
}

/// The claims of a JWT read without verifying it (the TokenReview verifies), to say early and
/// precisely why a token cannot pass, and to keep a verdict no longer than the token lives.
#[derive(Debug, Default, serde::Deserialize)]
struct Claims {
    exp: Option<u64>,
    #[serde(default, deserialize_with = "one_or_many")]
    aud: Vec<String>,
}

fn one_or_many<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(serde::Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(String),
        Many(Vec<String>),
    }
    Ok(
        match <Option<OneOrMany> as serde::Deserialize>::deserialize(d)? {
            None => Vec::new(),
            Some(OneOrMany::One(a)) => vec![a],
            Some(OneOrMany::Many(a)) => a,
        },
    )
}

/// The claims of `token` if it is a JWT (static and other opaque tokens have none).
fn claims(token: &str) -> Option<Claims> {
    let mut parts = token.split('.');
    let (_, payload, _) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    serde_json::from_slice(&bytes).ok()
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The token of an `authorization` header value.
pub fn bearer_token(header: Option<&[u8]>) -> Result<&str, Unauthenticated> {
    let Some(header) = header else {
        return Err(Unauthenticated::Missing {
            audiences: String::new(),
        });
    };
    let text = std::str::from_utf8(header)
        .map_err(|_| Unauthenticated::Malformed("the authorization header is not text"))?;
    let (scheme, token) = text
        .split_once(' ')
        .ok_or(Unauthenticated::Malformed("expected `Bearer <token>`"))?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Err(Unauthenticated::Malformed(
            "only the Bearer scheme is accepted",
        ));
    }
    let token = token.trim();
    if token.is_empty() {
        return Err(Unauthenticated::Malformed("the bearer token is empty"));
    }
    if token.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(Unauthenticated::Malformed(
            "the bearer token holds whitespace",
        ));
    }
    Ok(token)
}

/// A token that passed review.
#[derive(Clone, Debug)]
struct Verdict {
    identity: Arc<Identity>,
    /// When the token itself expires, as Unix seconds.
    token_expiry: Option<u64>,
}

struct VerdictExpiry {
    ttl: Duration,
}

impl moka::Expiry<[u8; 32], Verdict> for VerdictExpiry {
    fn expire_after_create(&self, _: &[u8; 32], v: &Verdict, _: Instant) -> Option<Duration> {
        let ttl = self.ttl;
        let lives = v
            .token_expiry
            .map(|exp| Duration::from_secs(exp.saturating_sub(unix_now())));
        Some(lives.map_or(ttl, |lives| lives.min(ttl)))
    }
}

/// Verifies bearer tokens with TokenReview, through a bounded cache.
pub struct Authenticator {
    client: Client,
    config: AuthConfig,
    audiences: String,
    /// Verdicts of tokens that passed, within the cache ttl.
    cache: moka::future::Cache<[u8; 32], Verdict>,
    /// Refusals, within the refusal ttl: apart, so a flood of bad tokens never pushes out a
    /// verified one.
    refused: moka::sync::Cache<[u8; 32], Unauthenticated>,
    /// Tokens that passed a review, until they expire: reviewed again outside the budget of
    /// new tokens.
    known: moka::sync::Cache<[u8; 32], Option<u64>>,
    rates: RateLimits,
    /// Reviews of tokens never verified, over all callers.
    reviews: governor::DefaultDirectRateLimiter,
    /// Reviews of new tokens from peers whose tokens failed.
    failing_peers: RateLimits,
}

/// Longest a verified token counts as known without a `exp` claim.
const KNOWN_AT_MOST: Duration = Duration::from_secs(24 * 3600);

/// A known token is forgotten when it expires (its `exp`, as Unix seconds).
struct UntilTokenExpiry;

impl moka::Expiry<[u8; 32], Option<u64>> for UntilTokenExpiry {
    fn expire_after_create(&self, _: &[u8; 32], exp: &Option<u64>, _: Instant) -> Option<Duration> {
        Some(exp.map_or(KNOWN_AT_MOST, |exp| {
            Duration::from_secs(exp.saturating_sub(unix_now())).min(KNOWN_AT_MOST)
        }))
    }
}

impl std::fmt::Debug for Authenticator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authenticator")
            .field("config", &self.config)
            .field("cached", &self.cache.entry_count())
            .finish()
    }
}

impl Authenticator {
    /// Reviews tokens through `client` (whose identity may create `tokenreviews`).
    pub fn new(client: Client, config: AuthConfig) -> Self {
        let cache = moka::future::Cache::builder()
            .max_capacity(config.cache_capacity)
            .expire_after(VerdictExpiry {
                ttl: config.cache_ttl,
            })
            .build();
        Self {
            client,
            audiences: config.audiences.join(" or "),
            rates: RateLimits::new(config.rate, config.cache_capacity),
            reviews: governor::RateLimiter::direct(
                governor::Quota::per_second(config.review_rate.per_second)
                    .allow_burst(config.review_rate.burst),
            ),
            refused: moka::sync::Cache::builder()
                .max_capacity(config.cache_capacity)
                .time_to_live(config.refusal_ttl)
                .build(),
            known: moka::sync::Cache::builder()
                .max_capacity(config.cache_capacity)
                .expire_after(UntilTokenExpiry)
                .build(),
            failing_peers: RateLimits::new(config.failures_per_peer, config.cache_capacity),
            config,
            cache,
        }
    }

    /// Counts one request of `identity` against its rate.
    pub fn admit(&self, identity: &Identity) -> Result<(), RateExceeded> {
        self.rates.check(&identity.username)
    }

    /// The caller who sent `header` (the `authorization` header's value) from `peer`.
    pub async fn authenticate(
        &self,
        header: Option<&[u8]>,
        peer: Option<std::net::IpAddr>,
    ) -> Result<Arc<Identity>, Unauthenticated> {
        let token = bearer_token(header).map_err(|e| match e {
            Unauthenticated::Missing { .. } => Unauthenticated::Missing {
                audiences: self.audiences.clone(),
            },
            e => e,
        })?;
        // Refused without a review: nothing the API server says could make it pass.
        let Some(claims) = claims(token) else {
            return Err(Unauthenticated::NotAJwt(self.audiences.clone()));
        };
        let now = unix_now();
        if let Some(exp) = claims.exp
            && exp <= now
        {
            return Err(Unauthenticated::Expired(now - exp));
        }
        if !claims.aud.iter().any(|a| self.config.audiences.contains(a)) {
            return Err(Unauthenticated::WrongAudience {
                got: claims.aud.clone(),
                want: self.audiences.clone(),
            });
        }
        let key: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        if let Some(refusal) = self.refused.get(&key) {
            return Err(refusal);
        }
        let token_expiry = claims.exp;
        let verdict = self
            .cache
            .try_get_with(key, async {
                // Only a review names the peer: a cached verdict costs no allocation.
                let peer_name = peer.map_or_else(|| "unknown".to_owned(), |p| p.to_string());
                // A token verified before is reviewed again ahead of new ones.
                if !self.known.contains_key(&key) {
                    if let Err(e) = self.failing_peers.check_if_known(&peer_name) {
                        return Err(Unauthenticated::FailingPeer {
                            peer: peer_name.clone(),
                            per_second: e.per_second,
                            burst: e.burst,
                            retry_after: e.retry_after,
                        });
                    }
                    if self.reviews.check().is_err() {
                        let rate = self.config.review_rate;
                        return Err(Unauthenticated::Unavailable(format!(
                            "this server reviews at most {} new tokens per second (bursts of {}) and is at that rate: retry",
                            rate.per_second, rate.burst
                        )));
                    }
                }
                match self.review(token).await? {
                    Ok(identity) => {
                        self.known.insert(key, token_expiry);
                        Ok(Verdict {
                            identity,
                            token_expiry,
                        })
                    }
                    Err(refusal) => {
                        // Counted against the peer; remembered apart from the verdicts.
                        let _ = self.failing_peers.check(&peer_name);
                        self.refused.insert(key, refusal.clone());
                        Err(refusal)
                    }
                }
            })
            .await
            .map_err(|e: Arc<Unauthenticated>| (*e).clone())?;
        Ok(verdict.identity)
    }

    /// One TokenReview; `Err` when it could not be made (not cached).
    async fn review(
        &self,
        token: &str,
    ) -> Result<Result<Arc<Identity>, Unauthenticated>, Unauthenticated> {
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: token.to_owned(),
                audiences: Some(self.config.audiences.clone()),
            },
            ..TokenReview::default()
        };
        let reviewed = Api::<TokenReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| {
                warn!(error = %e, "TokenReview failed");
                Unauthenticated::Unavailable(format!("TokenReview failed: {e}"))
            })?;
        let status = reviewed.status.unwrap_or_default();
        if status.authenticated != Some(true) {
            let why = status
                .error
                .filter(|e| !e.is_empty())
                .unwrap_or_else(|| "not authenticated".into());
            return Ok(Err(Unauthenticated::Rejected(why)));
        }
        // The API server answers the audiences of ours the token is valid for; none (an
        // authenticator that does not check audiences) is not a pass.
        let got = status.audiences.unwrap_or_default();
        if !got.iter().any(|a| self.config.audiences.contains(a)) {
            return Ok(Err(Unauthenticated::WrongAudience {
                got,
                want: self.audiences.clone(),
            }));
        }
        let Some(user) = status.user else {
            return Ok(Err(Unauthenticated::Rejected(
                "the review named no user".into(),
            )));
        };
        Ok(Ok(Arc::new(Identity::from_user(user))))
    }
}

/// This process's own identity as the API server sees it (a SelfSubjectReview), for servers
/// that admit only their own kind as callers (the dispatchers' Peer service).
pub async fn own_identity(client: &Client) -> Result<Identity, kube::Error> {
    let reviewed = Api::<SelfSubjectReview>::all(client.clone())
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await?;
    Ok(Identity::from_user(
        reviewed
            .status
            .and_then(|s| s.user_info)
            .unwrap_or_default(),
    ))
}

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
}

impl AuthLayer {
    /// Authenticates as `authentication` says, within `limits`; refusals counted in `refusals`.
    pub fn new(authentication: Authentication, limits: &ServerLimits, refusals: Refusals) -> Self {
        Self {
            authentication,
            unauthenticated: Arc::new(Semaphore::new(limits.max_unauthenticated_calls)),
            refusals,
        }
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
                    Caller::Authenticated(identity)
                }
            };
            request.extensions_mut().insert(caller);
            inner.call(request).await
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn jwt(claims: &str) -> String {
        let b64 = |s: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
        format!("{}.{}.sig", b64(r#"{"alg":"RS256"}"#), b64(claims))
    }

    fn valid_jwt(n: u32) -> String {
        jwt(&format!(
            r#"{{"aud":["kube-dispatch"],"exp":{},"n":{n}}}"#,
            unix_now() + 3600
        ))
    }

    /// An authenticator whose API server answers every TokenReview with `review` (JSON), and
    /// the number of reviews it was asked for.
    fn reviewed_by(
        review: &'static str,
        config: AuthConfig,
    ) -> (Authenticator, Arc<std::sync::atomic::AtomicUsize>) {
        let asked = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = asked.clone();
        let service = tower::service_fn(move |_: http::Request<kube::client::Body>| {
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            async move {
                Ok::<_, std::convert::Infallible>(http::Response::new(http_body_util::Full::<
                    bytes::Bytes,
                >::from(
                    review
                )))
            }
        });
        let client = Client::new(service, "default");
        (Authenticator::new(client, config), asked)
    }

    const PASS: &str = r#"{"apiVersion":"authentication.k8s.io/v1","kind":"TokenReview","spec":{},"status":{"authenticated":true,"audiences":["kube-dispatch"],"user":{"username":"system:serviceaccount:ns:good"}}}"#;
    const FAIL: &str = r#"{"apiVersion":"authentication.k8s.io/v1","kind":"TokenReview","spec":{},"status":{"authenticated":false,"error":"invalid bearer token"}}"#;
    const NO_AUDIENCES: &str = r#"{"apiVersion":"authentication.k8s.io/v1","kind":"TokenReview","spec":{},"status":{"authenticated":true,"user":{"username":"legacy"}}}"#;

    fn one() -> RequestRate {
        let one = std::num::NonZeroU32::new(1).expect("non-zero");
        RequestRate {
            per_second: one,
            burst: one,
        }
    }

    /// Tokens that cannot pass are refused without a review: not a JWT, expired, for another
    /// audience or none.
    #[tokio::test]
    async fn hopeless_tokens_are_refused_without_a_review() {
        let (authenticator, asked) = reviewed_by(PASS, AuthConfig::default());
        for (token, why) in [
            ("opaque-garbage".to_owned(), "not a JWT"),
            (jwt(r#"{"aud":["kube-dispatch"],"exp":1}"#), "expired"),
            (jwt(r#"{"aud":["other"]}"#), "audiences"),
            (jwt(r#"{"exp":99999999999}"#), "audiences"),
        ] {
            let header = format!("Bearer {token}");
            let e = authenticator
                .authenticate(Some(header.as_bytes()), None)
                .await
                .expect_err(why);
            assert!(e.to_string().contains(why), "{why}: {e}");
        }
        assert_eq!(asked.load(std::sync::atomic::Ordering::SeqCst), 0);
    }

    /// A review that names none of our audiences (an authenticator that ignores them) is no
    /// pass.
    #[tokio::test]
    async fn a_review_without_audiences_does_not_pass() {
        let (authenticator, _) = reviewed_by(NO_AUDIENCES, AuthConfig::default());
        let header = format!("Bearer {}", valid_jwt(1));
        let e = authenticator
            .authenticate(Some(header.as_bytes()), None)
            .await
            .expect_err("no audience");
        assert!(matches!(e, Unauthenticated::WrongAudience { .. }), "{e}");
    }

    /// New tokens past the review rate are refused as UNAVAILABLE without asking the API
    /// server, while a token verified before is reviewed again outside that budget.
    #[tokio::test]
    async fn verified_tokens_are_reviewed_again_ahead_of_new_ones() {
        let config = AuthConfig {
            review_rate: one(),
            cache_ttl: Duration::from_millis(1),
            ..AuthConfig::default()
        };
        let (authenticator, asked) = reviewed_by(PASS, config);
        let good = format!("Bearer {}", valid_jwt(0));
        let identity = authenticator
            .authenticate(Some(good.as_bytes()), None)
            .await
            .expect("the first new token is reviewed");
        assert_eq!(identity.username, "system:serviceaccount:ns:good");
        let new = format!("Bearer {}", valid_jwt(1));
        let second = authenticator
            .authenticate(Some(new.as_bytes()), None)
            .await
            .expect_err("over the rate");
        assert_eq!(
            Status::from(second.clone()).code(),
            tonic::Code::Unavailable
        );
        assert!(
            second
                .to_string()
                .contains("reviews at most 1 new tokens per second"),
            "{second}"
        );
        // The verdict aged out (1 ms): the known token is reviewed again at once.
        tokio::time::sleep(Duration::from_millis(5)).await;
        authenticator.cache.run_pending_tasks().await;
        authenticator
            .authenticate(Some(good.as_bytes()), None)
            .await
            .expect("a known token is not held to the budget of new ones");
        assert_eq!(asked.load(std::sync::atomic::Ordering::SeqCst), 2);
    }

    /// A peer whose tokens fail review is held to its own budget of further reviews; another
    /// peer is reviewed as before.
    #[tokio::test]
    async fn a_failing_peer_is_held_to_its_budget() {
        let config = AuthConfig {
            failures_per_peer: one(),
            ..AuthConfig::default()
        };
        let (authenticator, asked) = reviewed_by(FAIL, config);
        let (bad, other): (std::net::IpAddr, std::net::IpAddr) = (
            "10.0.0.66".parse().expect("an address"),
            "10.0.0.7".parse().expect("an address"),
        );
        let attempt = |n: u32, peer| {
            let header = format!("Bearer {}", valid_jwt(n));
            let authenticator = &authenticator;
            async move {
                authenticator
                    .authenticate(Some(header.as_bytes()), Some(peer))
                    .await
                    .expect_err("every token fails")
            }
        };
        assert!(matches!(
            attempt(1, bad).await,
            Unauthenticated::Rejected(_)
        ));
        let held = attempt(2, bad).await;
        assert!(
            matches!(held, Unauthenticated::FailingPeer { .. }),
            "{held}"
        );
        assert_eq!(Status::from(held).code(), tonic::Code::ResourceExhausted);
        assert!(matches!(
            attempt(3, other).await,
            Unauthenticated::Rejected(_)
        ));
        assert_eq!(asked.load(std::sync::atomic::Ordering::SeqCst), 2);
    }

    #[test]
    fn headers_are_parsed_or_refused_with_the_reason() {
        assert_eq!(bearer_token(Some(b"Bearer abc")), Ok("abc"));
        assert_eq!(bearer_token(Some(b"bearer  abc ")), Ok("abc"));
        assert!(matches!(
            bearer_token(None),
            Err(Unauthenticated::Missing { .. })
        ));
        for (header, why) in [
            (&b"Basic abc"[..], "only the Bearer scheme"),
            (b"Bearer", "expected `Bearer <token>`"),
            (b"Bearer ", "empty"),
            (b"Bearer a b", "whitespace"),
            (b"Bearer \xff", "not text"),
        ] {
            let e = bearer_token(Some(header)).unwrap_err();
            assert!(e.to_string().contains(why), "{header:?}: {e}");
        }
    }

    #[test]
    fn a_group_is_its_users_unless_listed() {
        let owners = GroupOwners::from_pairs([
            ("shared".to_owned(), "old-sa".to_owned()),
            ("shared".to_owned(), "new-sa".to_owned()),
        ]);
        // Unlisted: one group per user, whoever came first; authentication off: one group.
        let (a, b) = (
            owners.group_id("g", Some("a")).unwrap(),
            owners.group_id("g", Some("b")).unwrap(),
        );
        assert_ne!(a, b);
        assert_eq!(a.to_string(), "g (of a)");
        assert_eq!(owners.group_id("g", None).unwrap(), GroupId::shared("g"));
        // Listed: one group, exactly the users listed.
        for user in ["old-sa", "new-sa"] {
            assert_eq!(
                owners.group_id("shared", Some(user)).unwrap(),
                GroupId::shared("shared")
            );
        }
        let e = owners.group_id("shared", Some("other")).unwrap_err();
        assert_eq!(e.owner, "old-sa or new-sa");
        assert!(owners.group_id("shared", None).is_err());
    }

    #[test]
    fn claims_are_read_from_jwts_only() {
        let c = claims(&jwt(r#"{"exp":5,"aud":["a","b"]}"#)).unwrap();
        assert_eq!((c.exp, c.aud), (Some(5), vec!["a".into(), "b".into()]));
        let c = claims(&jwt(r#"{"aud":"a"}"#)).unwrap();
        assert_eq!((c.exp, c.aud), (None, vec!["a".to_owned()]));
        assert!(claims("opaque-static-token").is_none());
        assert!(claims("a.b.c.d").is_none());
        assert!(claims("a.!!!.c").is_none());
    }

    #[test]
    fn messages_never_carry_the_token() {
        let token = jwt(r#"{"exp":1,"aud":["other"]}"#);
        let header = format!("Bearer {token}");
        let e = bearer_token(Some(header.as_bytes())).map(|t| claims(t).unwrap());
        let claims = e.unwrap();
        let errors = [
            Unauthenticated::Expired(unix_now() - claims.exp.unwrap()),
            Unauthenticated::WrongAudience {
                got: claims.aud,
                want: "kube-dispatch".into(),
            },
        ];
        for e in errors {
            assert!(!e.to_string().contains(&token), "{e}");
        }
    }

    mod fuzzed {
        use proptest::prelude::*;

        use super::super::*;
        use super::jwt;

        proptest! {
            /// Any header value: no panic; a token taken is non-empty, free of whitespace,
            /// read back the same from `Bearer <token>`; a refusal never repeats the header.
            #[test]
            fn any_header_is_parsed_or_refused(header in proptest::collection::vec(any::<u8>(), 0..200)) {
                match bearer_token(Some(&header)) {
                    Ok(token) => {
                        prop_assert!(!token.is_empty());
                        prop_assert!(!token.chars().any(|c| c.is_whitespace() || c.is_control()));
                        let again = format!("Bearer {token}");
                        prop_assert_eq!(bearer_token(Some(again.as_bytes())), Ok(token));
                    }
                    Err(e) => {
                        let text = String::from_utf8_lossy(&header);
                        let secret = text.split_once(' ').map_or(&*text, |(_, rest)| rest).trim();
                        if secret.len() >= 4 {
                            prop_assert!(!e.to_string().contains(secret), "{e}");
                        }
                    }
                }
            }

            /// Any text as a token: reading claims never panics.
            #[test]
            fn any_token_is_read_or_skipped(token in "\\PC{0,300}") {
                let _ = claims(&token);
            }

            /// The claims of any well-formed JWT are read back as written.
            #[test]
            fn jwt_claims_round_trip(
                exp in proptest::option::of(any::<u64>()),
                aud in proptest::collection::vec("[a-z0-9.:/-]{1,20}", 0..4),
            ) {
                let json = serde_json::json!({ "exp": exp, "aud": aud }).to_string();
                let read = claims(&jwt(&json)).expect("claims of a JWT");
                prop_assert_eq!((read.exp, read.aud), (exp, aud));
            }
        }
    }
}
