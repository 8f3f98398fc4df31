//! `kdctl`, the operator CLI of kube-dispatch: what the dispatchers serve and hold
//! ([`command::status`]), who owns a key and where it stands ([`command::owner`]), and a drain
//! that hands a dispatcher's slice over before maintenance ([`command::drain`]). It calls the
//! dispatchers' operator API (`proto/kubedispatch/v1/operator.proto`) with TLS and a
//! ServiceAccount token, found through their Leases ([`connect`]); answers print as tables or
//! JSON ([`view`]).
//!
//! ```no_run
//! use std::time::Duration;
//!
//! use kdctl::{
//!     command,
//!     connect::{Connection, Target, TokenSource},
//!     view::Render as _,
//! };
//! use kube_dispatch_proto::credentials::Credentials;
//!
//! # async fn example(client: kube::Client) -> anyhow::Result<()> {
//! let target = Target {
//!     namespace: "kube-dispatch".into(),
//!     dispatchers: Vec::new(),
//!     credentials: Credentials::tls("ca.crt").with_server_name("kube-dispatch.kube-dispatch.svc"),
//!     token: TokenSource::ServiceAccount {
//!         namespace: "kube-dispatch".into(),
//!         name: "kdctl".into(),
//!     },
//!     audience: "kube-dispatch".into(),
//!     timeout: Duration::from_secs(10),
//! };
//! let connection = Connection::new(client, target).await?;
//! print!("{}", command::status(&connection).await?.table());
//! # Ok(())
//! # }
//! ```

#![forbid(unsafe_code)]

pub mod command;
pub mod connect;
pub mod view;
