//! The dispatcher's gRPC services: the wire turned into domain calls, and errors into
//! `tonic::Status`, nothing else.
//!
//! - [`dispatcher`]: the API controllers call (sessions, long-polls, acks);
//! - [`peer`]: the API dispatchers call on each other (remembered deletions), and the asking.

pub mod dispatcher;
pub mod peer;
