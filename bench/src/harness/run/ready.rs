//! Whether the tier's processes are ready, read from their admin endpoints, and the ports they
//! are given.

use std::time::Duration;

use anyhow::Context as _;

use crate::harness::admin::{counter_sum, http_status, scrape};

/// The figures the admin endpoint at `admin` shows now, if it answers within a second.
pub(super) async fn admin_figures(admin: u16) -> Option<String> {
    let scraped = tokio::time::timeout(
        Duration::from_secs(1),
        scrape(([127, 0, 0, 1], admin).into()),
    );
    let body = scraped.await.ok()?.ok()?;
    Some(String::from_utf8_lossy(&body).into_owned())
}

/// The dispatcher on `admin` sees a ring of `members` and serves every key it owns on it: its
/// figures say so (both from one scrape), and then its `/readyz` (asked after them, so a ring
/// adopted in between shows as a handover pending).
pub(super) async fn dispatcher_ready(admin: u16, members: usize) -> bool {
    let Some(figures) = admin_figures(admin).await else {
        return false;
    };
    counter_sum(&figures, "kube_dispatch_ring_members") == members as f64
        && counter_sum(&figures, "kube_dispatch_ring_serving") == 1.0
        && http_status(
            ([127, 0, 0, 1], admin).into(),
            "/readyz",
            Duration::from_secs(1),
        )
        .await
            == Some(200)
}

/// The load balancer on `admin` leads and knows all `members` dispatchers.
pub(super) async fn load_balancer_ready(admin: u16, members: usize) -> bool {
    admin_figures(admin).await.is_some_and(|figures| {
        counter_sum(&figures, "kube_dispatch_lb_leader") == 1.0
            && counter_sum(&figures, "kube_dispatch_lb_dispatchers") == members as f64
    })
}

/// `n` distinct free loopback ports: all held open until all are picked.
pub(super) fn free_ports(n: usize) -> anyhow::Result<Vec<u16>> {
    let listeners = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").context("no free loopback port"))
        .collect::<anyhow::Result<Vec<_>>>()?;
    listeners
        .iter()
        .map(|l| Ok(l.local_addr()?.port()))
        .collect()
}
