//! The watches of the API server, and how their events become request keys.
//!
//! - [`registry`]: the registry of the shared, non-caching watches, one per subscribed resource
//!   and selector;
//! - `task`: one watch's loop, its lists beside the stream and its recovery when broken;
//! - `fan_out`: one watch's events handed to the groups subscribed to it;
//! - [`object`]: an object as a watch receives it, its JSON (or protobuf) kept and only
//!   routing's fields decoded;
//! - [`routing`]: the rules that turn one event into request keys, bodies and deletions;
//! - `side_list`: the list run beside a watch's stream when the keys served here grow;
//! - `whole_list` and `list_reader`: a watch that lists a first page, then the rest in one
//!   response, read an object at a time (`--list-mode whole`);
//! - [`protobuf`]: built-in objects read in protobuf and handed on in the JSON the API server
//!   would have written, written only for the objects handed on;
//! - `shard`: on a ring keyed by namespace, the API server's `shardSelector` on the watches;
//! - [`sharing`]: on a ring keyed by name, one whole LIST made for every dispatcher that needs
//!   it (`Peer.List`);
//! - [`discovery`]: the resources subscriptions name, resolved and remembered.

pub mod discovery;
mod fan_out;
mod list_reader;
pub mod object;
pub mod protobuf;
pub mod registry;
pub mod routing;
#[cfg(test)]
pub(crate) mod scripted_api;
mod shard;
pub mod sharing;
mod side_list;
mod task;
mod whole_list;
