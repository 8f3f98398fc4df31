//! The dispatcher against the real API server: what arrives, with which reason and key, to
//! which session, and what the contract forbids (a key in flight twice, lost changes).
//!
//! One test per rule of the contract, sharing one set of fixtures.

mod support;

mod api;
mod events;
mod filters;
