//! Every request message of the wire API, decoded from arbitrary bytes and, where the
//! dispatcher validates it before any I/O, validated: neither may panic, however malformed the
//! input.

#![no_main]

use kube_dispatch_core::{
    request::ack_outcomes,
    subscription::{positive_duration, validate_open},
};
use kube_dispatch_proto::{
    RequestKey,
    v1::{
        AckRequest, CloseSessionRequest, OpenSessionRequest, PollRequest, RecentDeletionsRequest,
        RegisterRequest,
    },
};
use libfuzzer_sys::fuzz_target;
use prost::Message;

fuzz_target!(|data: &[u8]| {
    if let Ok(open) = OpenSessionRequest::decode(data) {
        let _ = validate_open(&open);
        if let Some(ttl) = &open.ttl {
            let _ = positive_duration("ttl", ttl);
        }
    }
    if let Ok(poll) = PollRequest::decode(data) {
        if let Some(wait) = &poll.wait {
            let _ = positive_duration("wait", wait);
        }
        let _ = ack_outcomes(&poll.acks, usize::MAX);
    }
    if let Ok(ack) = AckRequest::decode(data) {
        let _ = ack_outcomes(&ack.acks, usize::MAX);
    }
    let _ = CloseSessionRequest::decode(data);
    let _ = RegisterRequest::decode(data);
    let _ = RecentDeletionsRequest::decode(data);
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(key) = RequestKey::parse(text) {
            // A parsed key prints back to what was parsed.
            assert_eq!(key.to_string(), text);
        }
    }
});
