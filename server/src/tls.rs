//! TLS for kube-dispatch's gRPC servers: the serving certificate and key come from files (a
//! mounted Secret) and are read again when they change, so a rotated certificate is served to new
//! connections while the ones already open, and the sessions on them, carry on.
//!
//! [`incoming`] turns a listener into the connection stream a tonic server serves: plaintext
//! only when the operator asked for it ([`Transport::Plaintext`], the binaries' `--insecure`).
//!
//! Bounds: connections in all and per peer address ([`crate::bounds::Connections`]: past them a
//! new connection is closed at once); at most [`MAX_HANDSHAKES`] handshakes at once, and
//! [`MAX_HANDSHAKES_PER_PEER`] from one address (further connections are closed at once, as a
//! full backlog would refuse them), each within [`HANDSHAKE_TIMEOUT`]; a connection that sends
//! nothing within [`FIRST_BYTES_TIMEOUT`] of its handshake is closed; at most
//! [`ACCEPTED_BACKLOG`] accepted connections wait for the server to take them. A flood of
//! handshakes that never finish, or of connections that never speak, from a few addresses
//! holds a few places each, for seconds: a new replica, or a health check on a new connection,
//! still gets in (`proto/kubedispatch/v1/security.md`, "Threats and bounds").

use std::{
    future::Future as _,
    io,
    path::{Path, PathBuf},
    pin::Pin,
    sync::{Arc, RwLock},
    task::{Context, Poll},
    time::Duration,
};

use rustls::{
    ServerConfig,
    crypto::CryptoProvider,
    server::{ClientHello, ResolvesServerCert},
    sign::CertifiedKey,
};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::{TcpListener, TcpStream},
    sync::mpsc,
};
use tokio_rustls::{TlsAcceptor, server::TlsStream};
use tonic::transport::server::{Connected, TcpConnectInfo};
use tracing::{debug, info, warn};

use crate::bounds::{ConnectionPermit, Connections};
pub use crate::bounds::{MAX_HANDSHAKES, MAX_HANDSHAKES_PER_PEER};

/// Longest a client may take to complete its TLS handshake (one round trip and a signature on
/// a cluster's network: milliseconds).
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(2);
/// Most accepted connections waiting for the server to take them.
pub const ACCEPTED_BACKLOG: usize = 64;
/// Longest a connection may stay silent after it is accepted (after its TLS handshake): one
/// that has sent nothing by then is closed, so silent connections cannot hold the server's
/// places until HTTP/2 keepalive (which starts only once the client has spoken) would notice.
/// An HTTP/2 client sends its preface at once.
pub const FIRST_BYTES_TIMEOUT: Duration = Duration::from_secs(2);

/// How a server speaks to its clients.
#[derive(Clone, Debug)]
pub enum Transport {
    /// TLS with the certificate and key in these files.
    Tls(ServerTls),
    /// Plaintext: anyone on the network path reads and alters every call. Only behind an explicit
    /// flag, which logs a warning at start.
    Plaintext,
}

/// The serving certificate's files.
#[derive(Clone, Debug)]
pub struct ServerTls {
    /// PEM certificate chain, the server's own certificate first.
    pub cert_file: PathBuf,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1).
    pub key_file: PathBuf,
    /// How often the files are checked for a change.
    pub reload_interval: Duration,
}

impl ServerTls {
    /// The certificate and key in `cert_file` and `key_file`, checked for a change every 10 s.
    pub fn new(cert_file: impl Into<PathBuf>, key_file: impl Into<PathBuf>) -> Self {
        Self {
            cert_file: cert_file.into(),
            key_file: key_file.into(),
            reload_interval: Duration::from_secs(10),
        }
    }
}

/// Why the serving certificate could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read.
    #[error("cannot read {what} {path}: {source}")]
    Read {
        /// Which file.
        what: &'static str,
        /// Its path.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// A file holds no PEM block of the kind expected, or a broken one.
    #[error("{what} {path} holds no usable PEM {kind}: {detail}")]
    Pem {
        /// Which file.
        what: &'static str,
        /// Its path.
        path: PathBuf,
        /// What was looked for.
        kind: &'static str,
        /// What the parser said.
        detail: String,
    },
    /// The key does not fit the certificate, or rustls refused them.
    #[error("certificate {cert} and key {key} cannot serve TLS: {source}")]
    Unusable {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
        /// What rustls said.
        source: rustls::Error,
    },
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Reads and checks a certificate chain and its key.
fn load(tls: &ServerTls) -> Result<(Arc<CertifiedKey>, Vec<u8>), TlsError> {
    let read = |what: &'static str, path: &Path| {
        std::fs::read(path).map_err(|source| TlsError::Read {
            what,
            path: path.to_owned(),
            source,
        })
    };
    let cert_pem = read("certificate file", &tls.cert_file)?;
    let key_pem = read("key file", &tls.key_file)?;
    let chain = CertificateDer::pem_slice_iter(&cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Pem {
            what: "certificate file",
            path: tls.cert_file.clone(),
            kind: "CERTIFICATE",
            detail: e.to_string(),
        })?;
    if chain.is_empty() {
        return Err(TlsError::Pem {
            what: "certificate file",
            path: tls.cert_file.clone(),
            kind: "CERTIFICATE",
            detail: "no certificate found".into(),
        });
    }
    let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| TlsError::Pem {
        what: "key file",
        path: tls.key_file.clone(),
        kind: "PRIVATE KEY",
        detail: e.to_string(),
    })?;
    let certified =
        CertifiedKey::from_der(chain, key, &provider()).map_err(|source| TlsError::Unusable {
            cert: tls.cert_file.clone(),
            key: tls.key_file.clone(),
            source,
        })?;
    // What was loaded, to tell a change from the same files read again.
    let mut seen = cert_pem;
    seen.extend_from_slice(&key_pem);
    Ok((Arc::new(certified), seen))
}

/// Serves the certificate last loaded.
#[derive(Debug)]
struct Reloading {
    current: RwLock<Arc<CertifiedKey>>,
}

impl ResolvesServerCert for Reloading {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(
            self.current
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .clone(),
        )
    }
}

/// Reads the files every `reload_interval` while `alive` is open; a change that loads replaces
/// the certificate, one that does not is logged and the previous certificate kept.
async fn reload(
    tls: ServerTls,
    resolver: Arc<Reloading>,
    mut seen: Vec<u8>,
    alive: mpsc::Sender<io::Result<Conn>>,
) {
    let mut tick = tokio::time::interval(tls.reload_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tokio::select! {
            () = alive.closed() => return,
            _ = tick.tick() => {}
        }
        let files = (tls.cert_file.clone(), tls.key_file.clone());
        let same = {
            let seen = seen.clone();
            move || -> io::Result<bool> {
                let mut now = std::fs::read(&files.0)?;
                now.extend_from_slice(&std::fs::read(&files.1)?);
                Ok(now == seen)
            }
        };
        match tokio::task::spawn_blocking(same).await {
            Ok(Ok(true)) => continue,
            // Mid-rotation a file may be missing for a moment: try again next time.
            Ok(Err(e)) => {
                debug!(error = %e, "serving certificate files unreadable; keeping the current one");
                continue;
            }
            Ok(Ok(false)) | Err(_) => {}
        }
        let loaded = {
            let tls = tls.clone();
            tokio::task::spawn_blocking(move || load(&tls)).await
        };
        match loaded {
            Ok(Ok((certified, now))) => {
                *resolver.current.write().unwrap_or_else(|e| e.into_inner()) = certified;
                seen = now;
                info!(cert = %tls.cert_file.display(), "serving certificate reloaded: new connections use it, open ones carry on");
            }
            Ok(Err(e)) => {
                warn!(error = %e, "serving certificate changed but cannot be used; still serving the previous one");
            }
            Err(e) => warn!(error = %e, "serving certificate reload failed"),
        }
    }
}

/// The connections a server accepts on `listener`, over TLS unless `transport` is plaintext,
/// within `connections`' bounds, with TCP_NODELAY set (small gRPC frames such as a poll's
/// answer must not wait for a delayed ACK). The first certificate is loaded before this
/// returns, so a bad file fails at start; the stream ends (and the listener closes) when the
/// server drops it.
pub fn incoming(
    listener: TcpListener,
    transport: &Transport,
    connections: Arc<Connections>,
) -> Result<tokio_stream::wrappers::ReceiverStream<io::Result<Conn>>, TlsError> {
    let (tx, rx) = mpsc::channel(ACCEPTED_BACKLOG);
    let acceptor = match transport {
        Transport::Plaintext => None,
        Transport::Tls(tls) => {
            let (certified, seen) = load(tls)?;
            let resolver = Arc::new(Reloading {
                current: RwLock::new(certified),
            });
            let mut config = ServerConfig::builder_with_provider(provider())
                .with_safe_default_protocol_versions()
                .map_err(|source| TlsError::Unusable {
                    cert: tls.cert_file.clone(),
                    key: tls.key_file.clone(),
                    source,
                })?
                .with_no_client_auth()
                .with_cert_resolver(resolver.clone());
            config.alpn_protocols = vec![b"h2".to_vec()];
            tokio::spawn(reload(tls.clone(), resolver, seen, tx.clone()));
            Some(TlsAcceptor::from(Arc::new(config)))
        }
    };
    tokio::spawn(accept(listener, acceptor, connections, tx));
    Ok(tokio_stream::wrappers::ReceiverStream::new(rx))
}

async fn accept(
    listener: TcpListener,
    acceptor: Option<TlsAcceptor>,
    connections: Arc<Connections>,
    tx: mpsc::Sender<io::Result<Conn>>,
) {
    loop {
        let (tcp, peer) = tokio::select! {
            () = tx.closed() => return,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors and the like: wait rather than spin.
                    warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        // Closed at once (dropped) when this server or this peer is at its bound.
        let Some(permit) = connections.admit(peer.ip()) else {
            continue;
        };
        if let Err(e) = tcp.set_nodelay(true) {
            debug!(%peer, error = %e, "cannot set TCP_NODELAY");
        }
        let Some(acceptor) = &acceptor else {
            if tx
                .send(Ok(Conn::new(Inner::Plain(tcp), permit)))
                .await
                .is_err()
            {
                return;
            }
            continue;
        };
        // Closed at once when this server or this peer has as many handshakes in progress as
        // it may (counted and logged as a refusal).
        let Some(handshake) = connections.handshake(peer.ip()) else {
            continue;
        };
        let (acceptor, tx) = (acceptor.clone(), tx.clone());
        tokio::spawn(async move {
            let shaken = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await;
            drop(handshake);
            match shaken {
                Ok(Ok(tls)) => {
                    let _ = tx
                        .send(Ok(Conn::new(Inner::Tls(Box::new(tls)), permit)))
                        .await;
                }
                // A plaintext client, a client that does not trust our CA, a port scan: the
                // client sees the failure; here it is only worth a debug line.
                Ok(Err(e)) => debug!(%peer, error = %e, "TLS handshake failed"),
                Err(_) => debug!(%peer, timeout = ?HANDSHAKE_TIMEOUT, "TLS handshake timed out"),
            }
        });
    }
}

/// An accepted connection, over TLS or plaintext, holding its place within the server's
/// connection bounds until it closes.
#[derive(Debug)]
pub struct Conn {
    inner: Inner,
    /// Frees this connection's place when it closes.
    _permit: ConnectionPermit,
    /// Until the client has sent something: when it must have.
    silent_until: Option<Pin<Box<tokio::time::Sleep>>>,
}

#[derive(Debug)]
enum Inner {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl Conn {
    fn new(inner: Inner, permit: ConnectionPermit) -> Self {
        Self {
            inner,
            _permit: permit,
            silent_until: Some(Box::pin(tokio::time::sleep(FIRST_BYTES_TIMEOUT))),
        }
    }

    fn tcp(&self) -> &TcpStream {
        match &self.inner {
            Inner::Plain(tcp) => tcp,
            Inner::Tls(tls) => tls.get_ref().0,
        }
    }
}

impl Connected for Conn {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.tcp().connect_info()
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let read = match &mut this.inner {
            Inner::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Inner::Tls(s) => Pin::new(s).poll_read(cx, buf),
        };
        match read {
            Poll::Ready(Ok(())) if buf.filled().len() > before => {
                this.silent_until = None;
                Poll::Ready(Ok(()))
            }
            Poll::Pending => {
                let silent_too_long = this
                    .silent_until
                    .as_mut()
                    .is_some_and(|deadline| deadline.as_mut().poll(cx).is_ready());
                if silent_too_long {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("the client sent nothing within {FIRST_BYTES_TIMEOUT:?}"),
                    )));
                }
                Poll::Pending
            }
            other => other,
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match &mut self.get_mut().inner {
            Inner::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Inner::Tls(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match &mut self.get_mut().inner {
            Inner::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Inner::Tls(s) => Pin::new(s).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match &self.inner {
            Inner::Plain(s) => s.is_write_vectored(),
            Inner::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().inner {
            Inner::Plain(s) => Pin::new(s).poll_flush(cx),
            Inner::Tls(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().inner {
            Inner::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Inner::Tls(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

/// Logs, once at start, that a server runs without TLS.
pub fn warn_if_plaintext(transport: &Transport, server: &str) {
    if matches!(transport, Transport::Plaintext) {
        warn!(
            server,
            "serving PLAINTEXT (--insecure): anyone on the network path can read and alter every call; use --tls-cert-file and --tls-key-file"
        );
    }
}
