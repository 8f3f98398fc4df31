//! A paginated list run beside a watch's stream, when the keys served here grow (a handover
//! completes, a group joins the watch), and the deletions the stream shows meanwhile.

use std::{collections::HashSet, time::Duration};

use futures::{StreamExt, stream::BoxStream};
use kube::api::{Api, ListParams};
use kube_dispatch_core::backoff::Backoff;
use tracing::warn;

use super::object::WatchedObject;

/// Page size of a list beside the stream (the watcher's own lists use the same).
pub(super) const SIDE_LIST_PAGE: u32 = 500;

/// Most deletions remembered during one list beside the stream; past it the watch re-lists
/// instead (and the window that list beside the stream closes is open again for that once).
/// 65 536 key hashes, about 1 MiB.
const MAX_SIDE_LIST_DELETIONS: usize = 1 << 16;

/// A paginated list run beside the watch's stream, and the keys whose deletion the stream
/// showed since it began. The list may be older than events the stream has already shown: a
/// deletion among them would be undone by the list, so objects whose key is here are skipped
/// (the stream shows a re-creation after the deletion). A failed page starts the list again
/// after a backoff; the deletions are kept.
pub(super) struct SideList {
    pages: BoxStream<'static, Vec<WatchedObject>>,
    deleted: HashSet<u64>,
    /// The greatest request key the list must reach (the watch stops it at the page past it),
    /// or `None` to list everything.
    until: Option<String>,
}

impl SideList {
    /// Starts listing, in pages, up to the request key `until` (`None`: to the end).
    pub(super) fn start(
        api: Api<WatchedObject>,
        params: ListParams,
        until: Option<String>,
    ) -> Self {
        let backoff = Backoff {
            base: Duration::from_millis(500),
            cap: Duration::from_secs(30),
        };
        let pages = futures::stream::unfold(
            (Some(String::new()), 0u32),
            move |(continue_token, failures)| {
                let (api, params) = (api.clone(), params.clone());
                async move {
                    let mut token = continue_token?;
                    let mut failures = failures;
                    loop {
                        let mut page_params = params.clone();
                        if !token.is_empty() {
                            page_params = page_params.continue_token(&token);
                        }
                        match api.list(&page_params).await {
                            Ok(list) => {
                                let next = list.metadata.continue_.filter(|c| !c.is_empty());
                                return Some((list.items, (next, 0)));
                            }
                            Err(e) => {
                                failures += 1;
                                let delay = backoff.delay(failures);
                                warn!(error = %e, ?delay, "list beside the watch failed; listing again");
                                tokio::time::sleep(delay).await;
                                // A continue token may have expired: start over (a newer snapshot).
                                token.clear();
                            }
                        }
                    }
                }
            },
        )
        .boxed();
        Self {
            pages,
            deleted: HashSet::new(),
            until,
        }
    }

    /// The greatest request key this list must reach, if it need not list everything.
    pub(super) fn until(&self) -> Option<&str> {
        self.until.as_deref()
    }

    /// Notes a deletion the stream showed; false when too many are noted already.
    pub(super) fn deleted(&mut self, hash: u64) -> bool {
        if self.deleted.len() >= MAX_SIDE_LIST_DELETIONS && !self.deleted.contains(&hash) {
            return false;
        }
        self.deleted.insert(hash);
        true
    }

    pub(super) fn was_deleted(&self, hash: u64) -> bool {
        self.deleted.contains(&hash)
    }
}

/// The next page of the list beside the stream, if one runs (else never).
pub(super) async fn next_page(side: &mut Option<SideList>) -> Option<Vec<WatchedObject>> {
    match side {
        Some(list) => list.pages.next().await,
        None => std::future::pending().await,
    }
}
