//! Floods that would hold a server's door shut, for the tests and the hostile benchmark: TCP
//! connections that never start their TLS handshake, and TLS connections that finish it and
//! never speak, each reopened a tenth of a second after the server closes it.

use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr},
    path::Path,
    sync::Arc,
    time::Duration,
};

use rustls_pki_types::{CertificateDer, ServerName, pem::PemObject};
use tokio::{io::AsyncReadExt, net::TcpSocket, task::JoinSet};
use tokio_util::sync::CancellationToken;

use crate::TestResult;

/// A TLS client that trusts the CA bundle at `ca`, for callers that speak TLS themselves.
pub fn tls_connector(ca: &Path) -> TestResult<tokio_rustls::TlsConnector> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca)? {
        roots.add(cert?)?;
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
}

/// A connection to `server` from `from`, held until the server closes it or `stop`; then again,
/// a tenth of a second later. Without `tls` it never starts a handshake; with it, it finishes
/// one (as `localhost`) and says nothing.
pub async fn hold(
    server: SocketAddr,
    from: Ipv4Addr,
    tls: Option<tokio_rustls::TlsConnector>,
    stop: CancellationToken,
) {
    while !stop.is_cancelled() {
        let Ok(socket) = TcpSocket::new_v4() else {
            return;
        };
        if socket.bind(SocketAddr::new(IpAddr::V4(from), 0)).is_err() {
            return;
        }
        let connected = tokio::select! {
            () = stop.cancelled() => return,
            connected = socket.connect(server) => connected,
        };
        let Ok(tcp) = connected else {
            stop.run_until_cancelled(tokio::time::sleep(Duration::from_millis(50)))
                .await;
            continue;
        };
        let mut buf = [0u8; 256];
        let read = async {
            match &tls {
                None => {
                    let mut tcp = tcp;
                    while tcp.read(&mut buf).await.is_ok_and(|n| n > 0) {}
                }
                Some(connector) => {
                    let name = ServerName::try_from("localhost").expect("a name");
                    if let Ok(mut stream) = connector.connect(name, tcp).await {
                        while stream.read(&mut buf).await.is_ok_and(|n| n > 0) {}
                    }
                }
            }
        };
        tokio::select! {
            () = stop.cancelled() => return,
            () = read => {}
        }
        stop.run_until_cancelled(tokio::time::sleep(Duration::from_millis(100)))
            .await;
    }
}

/// From `addresses` loopback addresses (127.0.0.2 on), `stalled` connections each that never
/// start a handshake and `silent` that finish one and never speak, each held as [`hold`] holds
/// it, until `stop` and every holder has ended. Its holders run where it is spawned: on
/// [`Attackers`] when what it attacks is timed on the same machine.
pub async fn flood(
    server: SocketAddr,
    (addresses, stalled, silent): (u8, usize, usize),
    tls: tokio_rustls::TlsConnector,
    stop: CancellationToken,
) {
    let mut held = JoinSet::new();
    for a in 0..addresses {
        let from = Ipv4Addr::new(127, 0, 0, 2 + a);
        for _ in 0..stalled {
            held.spawn(hold(server, from, None, stop.clone()));
        }
        for _ in 0..silent {
            held.spawn(hold(server, from, Some(tls.clone()), stop.clone()));
        }
    }
    while held.join_next().await.is_some() {}
}

/// A runtime of two threads of its own for attackers, as they would be pods of their own: the
/// tasks of the server they attack, and of the clients timed against it, never queue behind
/// theirs (the machine's cores they share). Dropped, it shuts down without blocking, as it
/// must inside another runtime; its tasks should have ended by then.
#[derive(Debug)]
pub struct Attackers(Option<tokio::runtime::Runtime>);

impl Attackers {
    /// Starts the attackers' threads.
    pub fn start() -> std::io::Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("attackers")
            .enable_all()
            .build()?;
        Ok(Self(Some(runtime)))
    }

    /// Where to spawn an attacker.
    pub fn handle(&self) -> &tokio::runtime::Handle {
        self.0.as_ref().expect("taken only when dropped").handle()
    }
}

impl Drop for Attackers {
    fn drop(&mut self) {
        if let Some(runtime) = self.0.take() {
            runtime.shutdown_background();
        }
    }
}
