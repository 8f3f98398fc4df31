//! The TokenReview of a bearer token, for the expected audiences ([`Authenticator`]).
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
    sync::Arc,
    time::{Duration, Instant},
};

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use kube::{Api, Client, api::PostParams};
use sha2::{Digest, Sha256};
use tracing::warn;

use super::{
    claims::{bearer_token, claims, unix_now},
    error::Unauthenticated,
    identity::Identity,
};
use crate::limits::{RateExceeded, RateLimits, RequestRate};

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
            // A restart of the tier makes every replica's token new to a dispatcher: at 200 a
            // second, a thousand replicas reconnecting at once are all reviewed within 5 s
            // (`make bench-hostile`, reconnect storm; at 50 a second they took 20 s).
            review_rate: RequestRate {
                per_second: std::num::NonZeroU32::new(200).expect("non-zero"),
                burst: std::num::NonZeroU32::new(400).expect("non-zero"),
            },
            failures_per_peer: RequestRate {
                per_second: std::num::NonZeroU32::new(1).expect("non-zero"),
                burst: std::num::NonZeroU32::new(10).expect("non-zero"),
            },
        }
    }
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
                        return Err(Unauthenticated::ReviewsBusy {
                            per_second: rate.per_second.get(),
                            burst: rate.burst.get(),
                        });
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

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Status;

    use crate::auth::claims::jwt;

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
        let refused = Status::from(second.clone());
        assert_eq!(refused.code(), tonic::Code::Unavailable);
        assert_eq!(
            refused
                .metadata()
                .get(kube_dispatch_proto::RETRY_PUSHBACK)
                .and_then(|v| v.to_str().ok()),
            Some("1000"),
            "told when to ask again: {refused:?}"
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
}
