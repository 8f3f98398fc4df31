//! Why a call is not authenticated, in words that say what is wrong and never repeat the
//! token; and the gRPC status each reason is answered with.

use std::time::Duration;

use tonic::Status;

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
    /// The server reviews new tokens at its rate and is at it (a restart of the tier, when
    /// every replica's token is new to it): the call may be retried after the pushback its
    /// status carries (1 s).
    #[error(
        "cannot verify the token now: this server reviews at most {per_second} new tokens per second (bursts of {burst}) and is at that rate (--max-token-review-rate): retry in {} ms",
        REVIEWS_BUSY_PUSHBACK.as_millis()
    )]
    ReviewsBusy {
        /// Reviews per second.
        per_second: u32,
        /// Reviews at once.
        burst: u32,
    },
}

/// How long a caller refused because new tokens are reviewed at the server's rate is told to
/// wait (gRPC's pushback, `grpc-retry-pushback-ms`); the SDKs add up to as much again at random,
/// so replicas come back spread over the time the reviews take rather than in doubling waits.
pub(super) const REVIEWS_BUSY_PUSHBACK: std::time::Duration = std::time::Duration::from_secs(1);

impl From<Unauthenticated> for Status {
    fn from(e: Unauthenticated) -> Self {
        match e {
            Unauthenticated::Unavailable(_) => Status::unavailable(e.to_string()),
            Unauthenticated::ReviewsBusy { .. } => kube_dispatch_proto::with_pushback(
                Status::unavailable(e.to_string()),
                REVIEWS_BUSY_PUSHBACK,
            ),
            Unauthenticated::FailingPeer { .. } => Status::resource_exhausted(e.to_string()),
            _ => Status::unauthenticated(e.to_string()),
        }
    }
}
