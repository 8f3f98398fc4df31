//! The admin endpoints of the tier's processes, as the harness reads them: `GET` over plain
//! HTTP on loopback, and the Prometheus text their `/metrics` serves.

use std::time::Duration;

/// The whole HTTP response of `GET /metrics` on `admin`.
pub(crate) async fn scrape(admin: std::net::SocketAddr) -> std::io::Result<Vec<u8>> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut stream = tokio::net::TcpStream::connect(admin).await?;
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n")
        .await?;
    let mut body = Vec::new();
    stream.read_to_end(&mut body).await?;
    Ok(body)
}

/// The status code `GET path` answers on `addr` within `timeout`.
pub(crate) async fn http_status(
    addr: std::net::SocketAddr,
    path: &str,
    timeout: Duration,
) -> Option<u16> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    tokio::time::timeout(timeout, async {
        let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
        let request = format!("GET {path} HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut head = [0u8; 12];
        stream.read_exact(&mut head).await.ok()?;
        std::str::from_utf8(&head[9..12]).ok()?.parse().ok()
    })
    .await
    .ok()
    .flatten()
}

/// The sum of a counter's samples in a Prometheus text exposition.
pub(crate) fn counter_sum(exposition: &str, name: &str) -> f64 {
    exposition
        .lines()
        .filter(|line| {
            line.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counter_sums_every_series_of_the_name_only() {
        let text = "# TYPE kube_dispatch_watch_events_total counter\nkube_dispatch_watch_events_total{resource=\"configmaps\",type=\"applied\"} 12\nkube_dispatch_watch_events_total{resource=\"configmaps\",type=\"deleted\"} 3\nkube_dispatch_watch_events_totally 99\n";
        assert_eq!(counter_sum(text, "kube_dispatch_watch_events_total"), 15.0);
    }
}
