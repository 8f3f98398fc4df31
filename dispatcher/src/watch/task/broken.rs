//! What a broken stream leads to: retried after a backoff, listed again at once after a 410
//! Gone, listed another way or in JSON, or failed for good ([`WatchRetry::recover`]).

use std::sync::atomic::Ordering;

use kube::runtime::watcher;
use kube_dispatch_core::backoff::{Recovery, WatchFailure};
use tokio::time::Instant;
use tracing::{info, warn};

use super::{
    End, Pass, Readiness, WatchError, WatchTask,
    refusal::{needs_json, refuses_streaming, rejection, status_code},
};
use crate::{
    config::ListMode,
    watch::{
        fan_out::describe,
        protobuf::{self, Untranscodable},
        whole_list,
    },
};

impl WatchTask {
    /// The stream broke with `e`: what [`WatchRetry::recover`] decides; `Some` when it ends the
    /// pass.
    pub(super) fn broken(&mut self, pass: &mut Pass, e: &watcher::Error) -> Option<End> {
        self.counts.errors.fetch_add(1, Ordering::Relaxed);
        if status_code(e) == Some(410) {
            self.counts.gone.fetch_add(1, Ordering::Relaxed);
        }
        // 406: something in front of the API server that will not answer in protobuf.
        if self.protobuf && (needs_json(e) || status_code(e) == Some(406)) {
            let table = protobuf::table_source();
            warn!(resource = %describe(&self.key), error = %e, %table, "could not read the resource in protobuf (a field this dispatcher's table of types does not know: an API server newer than the dispatcher?); reading it in JSON from now on");
            self.protobuf = false;
            self.counts.json_fallbacks.fetch_add(1, Ordering::Relaxed);
            return Some(End::Restart);
        }
        let failure = self.failure(e);
        match self.retry.recover(&failure, Instant::now().into_std()) {
            Recovery::ListInPages => {
                warn!(resource = %describe(&self.key), error = %e, "the API server does not stream lists; listing in pages instead");
                self.list_mode = ListMode::Paged;
                Some(End::Restart)
            }
            Recovery::ListByStreaming => {
                warn!(resource = %describe(&self.key), error = %e, "the list did not arrive whole (too large to list within the API server's request timeout?); listing by streaming instead, or in pages if the server refuses that");
                self.list_mode = ListMode::Stream;
                Some(End::Restart)
            }
            Recovery::Fail => {
                let (code, message) = rejection(e).unwrap_or_default();
                let failed = WatchError::Rejected {
                    code,
                    resource: describe(&self.key),
                    message,
                };
                warn!(resource = %describe(&self.key), error = %failed, "watch rejected");
                let _ = self.readiness.send(Readiness::Failed(failed));
                Some(End::Stop)
            }
            Recovery::ListAgain => {
                info!(resource = %describe(&self.key), error = %e, "watch expired (410 Gone): listing again at once");
                None
            }
            Recovery::RetryIn(wait) => {
                warn!(resource = %describe(&self.key), error = %e, retry_in = ?wait, "watch error; retrying");
                pass.paused = Some(Instant::now() + wait);
                None
            }
        }
    }

    /// An object read in protobuf whose JSON the table of types cannot write, met publishing
    /// it: as if reading it had failed, the watch reads the resource in JSON from now on
    /// ([`Self::broken`]), starting again with a list.
    pub(super) fn unwritable(&mut self, pass: &mut Pass, e: Untranscodable) -> End {
        // Only a watch reading protobuf has such objects, and the error is never a bound
        // (`FanOut::write_json`): `broken` turns it to JSON and ends the pass.
        debug_assert!(self.protobuf && !matches!(e, Untranscodable::Bound(_)));
        let error = watcher::Error::WatchFailed(protobuf::read_error(e));
        self.broken(pass, &error).unwrap_or(End::Restart)
    }

    /// `e` as the recovery policy sees it.
    fn failure(&self, e: &watcher::Error) -> WatchFailure {
        let streaming = self.list_mode == ListMode::Stream;
        WatchFailure {
            code: status_code(e),
            streaming_refused: streaming && refuses_streaming(e),
            whole_list_cut_short: self.list_mode == ListMode::Whole && whole_list::cut_short(e),
            starting: matches!(*self.readiness.borrow(), Readiness::Starting),
        }
    }
}
