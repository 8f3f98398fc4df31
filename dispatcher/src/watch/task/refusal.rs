//! What the API server's answer in a watch error says: a refusal, a refused streaming list,
//! its status code.

use kube::runtime::watcher;

/// The API server's refusal of a list or watch, if that is what the error is: a client error
/// (4xx other than 410 Gone, which the watcher recovers from by re-listing).
pub(super) fn rejection(e: &watcher::Error) -> Option<(u16, String)> {
    let status = api_status(e)?;
    ((400..500).contains(&status.code) && status.code != 410)
        .then(|| (status.code, status.message.clone()))
}

/// Whether the API server refused a streaming list, as one without the WatchList feature
/// does: "sendInitialEvents is forbidden for watch unless the WatchList feature gate is
/// enabled" (1.27 to 1.33 with the feature off), or, from a server older than the feature,
/// "resourceVersionMatch is forbidden for watch".
pub(super) fn refuses_streaming(e: &watcher::Error) -> bool {
    rejection(e).is_some_and(|(code, message)| {
        matches!(code, 400 | 422)
            && (message.contains("sendInitialEvents") || message.contains("resourceVersionMatch"))
    })
}

/// The API server's status in a watch error, if it answered one.
fn api_status(e: &watcher::Error) -> Option<&kube::core::Status> {
    match e {
        watcher::Error::InitialListFailed(kube::Error::Api(s))
        | watcher::Error::WatchStartFailed(kube::Error::Api(s))
        | watcher::Error::WatchFailed(kube::Error::Api(s)) => Some(s),
        watcher::Error::WatchError(s) => Some(s),
        _ => None,
    }
}

/// Whether a watch error is what the dispatcher's table of types could not read in protobuf
/// (`crate::watch::protobuf`): only JSON reads it.
pub(super) fn needs_json(e: &watcher::Error) -> bool {
    match e {
        watcher::Error::InitialListFailed(e)
        | watcher::Error::WatchStartFailed(e)
        | watcher::Error::WatchFailed(e) => crate::watch::protobuf::needs_json(e),
        _ => false,
    }
}

/// The HTTP status code of a watch error the API server answered.
pub(super) fn status_code(e: &watcher::Error) -> Option<u16> {
    api_status(e).map(|s| s.code)
}
