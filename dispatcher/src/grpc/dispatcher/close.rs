//! A close of a session no longer open here (`CloseSession` in the proto, `HANDOVER.md`,
//! "Ending the wait for a member that died, by reports").

use kube_dispatch_proto::v1::CloseSessionRequest;
use tonic::Status;
use tracing::info;

use super::{DispatcherService, MAX_ID_BYTES, status};
use crate::{membership::sessions::Reported, table::SessionError};

/// Longest a close waits for the Lease write that lists its session no more (writes for
/// sessions are spaced 200 ms apart); past it the close is answered UNAVAILABLE, and the SDK
/// asks again.
pub(super) const CLOSE_UNLISTED_WITHIN: std::time::Duration = std::time::Duration::from_secs(2);

impl DispatcherService {
    /// A close of a session no longer open here (`CloseSession` in the proto): one this process
    /// ended idle and its Lease may still list is answered once it does not (what to wait for
    /// is returned, as [`GroupTable::close`] returns it); one of this dispatcher's previous
    /// process, closed with its reconciles ended, is taken as the session's report and answered
    /// at once (`None`). Anything else is `not_open`.
    pub(super) fn closed_before(
        &self,
        close: &CloseSessionRequest,
        not_open: SessionError,
    ) -> Result<Option<u64>, Status> {
        let identity = self.groups.identity();
        let lease = self.groups.lease_sessions();
        let id = close.session_id.as_str();
        // Session ids begin with the dispatcher's identity (`GroupTable::open`).
        let ours = id.len() <= MAX_ID_BYTES
            && id
                .strip_prefix(identity)
                .is_some_and(|rest| rest.starts_with('-'));
        if !ours {
            return Err(status(not_open));
        }
        if let Some(made) = lease.unlisting(id) {
            return Ok(Some(made));
        }
        if !close.reconciles_ended {
            return Err(status(not_open));
        }
        if !lease.judged() {
            return Err(Status::unavailable(
                "this dispatcher does not know yet (just started) or now (fenced) whether its previous process listed the session: close it again",
            ));
        }
        match lease.report(identity, id) {
            Reported::Taken => {
                info!(session = %id, "a session of this dispatcher's previous process was closed again by its replica, its reconciles ended: taken as its report");
                Ok(None)
            }
            Reported::Full => Err(Status::unavailable(
                "too many reports of ended sessions wait to be carried: close it again",
            )),
            Reported::NotAwaited => Err(status(not_open)),
        }
    }
}
