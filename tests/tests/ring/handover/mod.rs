//! Live rings against the real API server: dispatchers join, leave and die while objects are
//! written; controller replicas come and go; the load balancer leader dies. The journal checks
//! what matters: no key reconciled by two replicas at once, every final state reconciled, and
//! keys that moved reconciled again by their new owner.
//!
//! Every handover path, sharing the ring fixtures and journal checks.

mod support;

mod children;
mod deletions;
mod held_writes;
mod joining;
mod load_balancer;
mod scaling;
