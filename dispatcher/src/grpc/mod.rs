//! The dispatcher's gRPC services: the wire turned into domain calls, and errors into
//! `tonic::Status`, nothing else.
//!
//! - [`dispatcher`]: the API controllers call (sessions, long-polls, acks);
//! - [`peer`]: the API dispatchers call on each other (remembered deletions), and the asking;
//! - [`operator`]: the API operators call (status, where a key stands, drain).

pub mod dispatcher;
pub mod operator;
pub mod peer;
