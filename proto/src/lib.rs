//! The kube-dispatch wire API.
//!
//! Controller replicas talk to dispatchers through the [`v1::dispatcher_client::DispatcherClient`]
//! generated from `proto/kubedispatch/v1/dispatcher.proto`; dispatchers implement
//! [`v1::dispatcher_server::Dispatcher`]. Replicas learn which dispatchers to poll from the load
//! balancer's [`v1::load_balancer_client::LoadBalancerClient`] (`loadbalancer.proto`); dispatchers
//! ask each other for remembered deletions through [`v1::peer_client::PeerClient`]
//! (`peer.proto`). The
//! `.proto` files are the contract for clients in any
//! language: every message and field is documented there.
//!
//! The request-key format ([`RequestKey`]), its hash and the ring that places keys on dispatchers
//! ([`Ring`]) are part of the same contract, specified in `proto/kubedispatch/v1/keys.md`; so
//! are the dispatcher Leases that membership and placement read ([`lease`],
//! `proto/kubedispatch/v1/leases.md`).
//!
//! ```no_run
//! use kube_dispatch_proto::v1::{OpenSessionRequest, dispatcher_client::DispatcherClient};
//!
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! let mut client = DispatcherClient::connect("http://127.0.0.1:7070").await?;
//! let session = client
//!     .open_session(OpenSessionRequest {
//!         group: "configmap-hasher".into(),
//!         replica_id: "configmap-hasher-0".into(),
//!         ..Default::default()
//!     })
//!     .await?
//!     .into_inner();
//! println!("session {} on {}", session.session_id, session.dispatcher_id);
//! # Ok(())
//! # }
//! ```

#![forbid(unsafe_code)]

pub mod capabilities;
pub mod credentials;
pub mod key;
pub mod lease;
pub mod ring;

pub use key::{KeyError, RequestKey};
pub use ring::{Ring, RingKey};

/// The largest answer a client accepts when its poll names none (`PollRequest.max_bytes` 0):
/// 4 MiB, the default decoding limit of gRPC clients.
pub const DEFAULT_MAX_ANSWER_BYTES: u32 = 4 * 1024 * 1024;

/// Most bytes of the memo an acknowledgement may leave for its key's next delivery
/// (`AckItem.memo`).
pub const MAX_MEMO_BYTES: usize = 512;

/// Most keys one `Dispatcher.Trigger` may name.
pub const MAX_TRIGGER_KEYS: usize = 1000;

/// The metadata key of gRPC's pushback (gRFC A6): the milliseconds a refused caller should wait
/// before asking again. A dispatcher sets it on an OpenSession refused because too many were
/// being opened at once; the SDKs then wait at least that long, plus up to as much again at
/// random, so a storm of reconnects spreads out.
pub const RETRY_PUSHBACK: &str = "grpc-retry-pushback-ms";

/// `status`, asking its caller to wait `wait` before asking again ([`RETRY_PUSHBACK`]).
pub fn with_pushback(mut status: tonic::Status, wait: std::time::Duration) -> tonic::Status {
    if let Ok(value) = wait.as_millis().to_string().parse() {
        status.metadata_mut().insert(RETRY_PUSHBACK, value);
    }
    status
}

/// How long `status` asks its caller to wait before asking again ([`RETRY_PUSHBACK`]), if it
/// does: a count of milliseconds, anything else ignored.
pub fn pushback_of(status: &tonic::Status) -> Option<std::time::Duration> {
    let millis = status
        .metadata()
        .get(RETRY_PUSHBACK)?
        .to_str()
        .ok()?
        .parse()
        .ok()?;
    Some(std::time::Duration::from_millis(millis))
}

/// Bytes a dispatcher leaves free under a client's `max_bytes` for the answer's own framing.
pub const ANSWER_HEADROOM: u32 = 4 * 1024;

/// The bytes of reconcile requests a dispatcher puts in an answer to a poll that accepts
/// `max_bytes` (0: [`DEFAULT_MAX_ANSWER_BYTES`]), under its own bound `dispatcher_max`.
pub fn answer_budget(max_bytes: u32, dispatcher_max: usize) -> usize {
    let accepted = match max_bytes {
        0 => DEFAULT_MAX_ANSWER_BYTES,
        n => n,
    };
    // A client that accepts less than the headroom twice over gets half of what it accepts.
    let budget = accepted.saturating_sub(ANSWER_HEADROOM).max(accepted / 2);
    usize::try_from(budget)
        .unwrap_or(usize::MAX)
        .min(dispatcher_max)
}

/// Whether a delivery or change of this reason is about another object than the key's own (an
/// owned one, a named one) or about none (a trigger): it says nothing of the key's own object.
pub fn is_related(reason: v1::Reason) -> bool {
    matches!(
        reason,
        v1::Reason::Owned | v1::Reason::Referenced | v1::Reason::Triggered
    )
}

/// Version 1 of the API, package `kubedispatch.v1`.
#[allow(missing_docs, unreachable_pub, clippy::all)]
pub mod v1 {
    tonic::include_proto!("kubedispatch.v1");

    /// The encoded `FileDescriptorSet` of package `kubedispatch.v1`, for gRPC server reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] =
        tonic::include_file_descriptor_set!("kubedispatch_v1_descriptor");
}
