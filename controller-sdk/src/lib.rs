//! The kube-dispatch controller SDK.
//!
//! Controllers written against this crate receive reconcile requests from dispatchers over the
//! [`kube_dispatch_proto::v1`] API instead of running informers: a replica holds no cache, needs
//! no leader election, and can be killed and restarted at any time.

#![forbid(unsafe_code)]
