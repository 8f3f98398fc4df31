//! How a client of the tier (a controller replica, a dispatcher asking its peers, an operator's
//! tool) reaches a server: over TLS, verifying the server against a CA bundle, and with a
//! Kubernetes ServiceAccount token as its bearer credential (`proto/kubedispatch/v1/security.md`).
//!
//! ```no_run
//! use kube_dispatch_proto::{credentials::Credentials, v1::dispatcher_client::DispatcherClient};
//!
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! let credentials = Credentials::tls("/var/run/kube-dispatch/ca.crt")
//!     .with_token_file("/var/run/secrets/kube-dispatch/token");
//! let channel = credentials.endpoint("kube-dispatch-0.kube-dispatch:7070")?.connect().await?;
//! let client = DispatcherClient::with_interceptor(channel, credentials.bearer());
//! # drop(client);
//! # Ok(())
//! # }
//! ```
//!
//! The CA bundle is read again for every connection, and the token file at most every
//! [`TOKEN_REREAD`], so a rotated bundle or token (the kubelet rewrites a projected token well
//! before it expires) is used without a restart. A token never appears in an error or a log.

use std::{
    fmt,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use tonic::{
    Request, Status,
    metadata::{AsciiMetadataValue, MetadataValue},
    service::{Interceptor, interceptor::InterceptedService},
    transport::{Certificate, Channel, ClientTlsConfig, Endpoint},
};

/// How long a connection attempt of an [`Credentials::endpoint`] may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A projected token file is read again at most this often.
pub const TOKEN_REREAD: Duration = Duration::from_secs(30);

/// The audience kube-dispatch's servers expect on a ServiceAccount token by default.
pub const DEFAULT_AUDIENCE: &str = "kube-dispatch";

/// Where `deploy/` mounts the projected ServiceAccount token for kube-dispatch.
pub const DEFAULT_TOKEN_FILE: &str = "/var/run/secrets/kube-dispatch/token";

/// Where `deploy/` mounts the CA bundle that kube-dispatch's serving certificates chain to.
pub const DEFAULT_CA_FILE: &str = "/var/run/secrets/kube-dispatch/ca.crt";

/// A channel that adds the bearer credential to every call.
pub type AuthChannel = InterceptedService<Channel, Bearer>;

/// Why a server could not be addressed.
#[derive(Debug, thiserror::Error)]
pub enum CredentialsError {
    /// The address is not `host:port` or a URL of one.
    #[error("bad address {address:?}: {detail}")]
    Address {
        /// The address given.
        address: String,
        /// What is wrong with it.
        detail: String,
    },
    /// The scheme contradicts the transport: `http://` with TLS configured, or `https://`
    /// without.
    #[error(
        "address {address:?} asks for {asked} but this client is configured for {configured}; give host:port or the matching scheme"
    )]
    Scheme {
        /// The address given.
        address: String,
        /// What the address asks for.
        asked: &'static str,
        /// What the client is configured for.
        configured: &'static str,
    },
    /// The CA bundle could not be read.
    #[error("cannot read the CA bundle {path}: {source}")]
    Ca {
        /// Its path.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// tonic refused the TLS settings.
    #[error("TLS settings refused: {0}")]
    Tls(#[from] tonic::transport::Error),
}

/// How to reach and authenticate to kube-dispatch's servers.
#[derive(Clone, Debug)]
pub struct Credentials {
    tls: Option<ClientTls>,
    token: Bearer,
}

#[derive(Clone, Debug)]
struct ClientTls {
    ca: Ca,
    server_name: Option<String>,
    /// The name on the load balancer's certificate, when set apart from the address's host.
    load_balancer_server_name: Option<String>,
}

/// Where the CA bundle comes from.
#[derive(Clone, Debug)]
enum Ca {
    /// A file, read again for every connection (a rotated bundle is picked up).
    File(PathBuf),
    /// A bundle in memory (read from the cluster, say).
    Pem(std::sync::Arc<[u8]>),
}

impl Credentials {
    /// TLS, verifying servers against the PEM CA bundle in `ca_file`; no token until one is
    /// given.
    pub fn tls(ca_file: impl Into<PathBuf>) -> Self {
        Self::with_ca(Ca::File(ca_file.into()))
    }

    /// TLS, verifying servers against the PEM CA bundle `pem` (for example the one the tier
    /// publishes in the cluster); no token until one is given.
    pub fn tls_pem(pem: impl Into<Vec<u8>>) -> Self {
        Self::with_ca(Ca::Pem(pem.into().into()))
    }

    fn with_ca(ca: Ca) -> Self {
        Self {
            tls: Some(ClientTls {
                ca,
                server_name: None,
                load_balancer_server_name: None,
            }),
            token: Bearer::none(),
        }
    }

    /// Plaintext: anyone on the path reads the calls and the token. For servers run with
    /// `--insecure` only.
    pub fn plaintext() -> Self {
        Self {
            tls: None,
            token: Bearer::none(),
        }
    }

    /// The name the dispatchers' certificate must carry, instead of the host of each address
    /// (dispatchers publish pod IPs on their Leases; their certificate names the Service).
    /// The load balancer has a certificate of its own: see [`Credentials::for_load_balancer`].
    #[must_use]
    pub fn with_server_name(mut self, name: impl Into<String>) -> Self {
        if let Some(tls) = &mut self.tls {
            tls.server_name = Some(name.into());
        }
        self
    }

    /// The name the load balancer's certificate must carry, when it is not the host of the
    /// load balancer's address (which is dialled by a name; a leader it redirects to, by pod
    /// IP, is verified under that same name).
    #[must_use]
    pub fn with_load_balancer_server_name(mut self, name: impl Into<String>) -> Self {
        if let Some(tls) = &mut self.tls {
            tls.load_balancer_server_name = Some(name.into());
        }
        self
    }

    /// These credentials as they reach the load balancer first dialled at `address`. The load
    /// balancer serves a certificate of its own, not the dispatchers' (a compromised load
    /// balancer cannot pose as a dispatcher): it is verified under the name set with
    /// [`Credentials::with_load_balancer_server_name`], else under the host of `address`
    /// when that is a name, else under each address's own host.
    pub fn for_load_balancer(&self, address: &str) -> Self {
        let mut lb = self.clone();
        if let Some(tls) = &mut lb.tls {
            tls.server_name = tls
                .load_balancer_server_name
                .clone()
                .or_else(|| host_name(address));
        }
        lb
    }

    /// Sends the token in `path` (a projected ServiceAccount token), read again as the kubelet
    /// rotates it.
    #[must_use]
    pub fn with_token_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.token = Bearer::file(path.into());
        self
    }

    /// Sends `token` (tests, tools that obtained one with TokenRequest).
    #[must_use]
    pub fn with_token(mut self, token: impl Into<String>) -> Self {
        self.token = Bearer::fixed(token.into());
        self
    }

    /// What the environment says, with the names and defaults the servers' flags use:
    ///
    /// | variable | meaning | default |
    /// | --- | --- | --- |
    /// | `KD_INSECURE` | plaintext (`true`/`1`/`yes`) | TLS |
    /// | `KD_TLS_CA_FILE` | CA bundle the servers chain to | [`DEFAULT_CA_FILE`] |
    /// | `KD_TLS_SERVER_NAME` | name on the dispatchers' certificate | the host of each address |
    /// | `KD_LOADBALANCER_TLS_SERVER_NAME` | name on the load balancer's certificate | the host of its address |
    /// | `KD_ALLOW_ANONYMOUS` | send no token (`true`/`1`/`yes`) | send one |
    /// | `KD_TOKEN_FILE` | the projected token | [`DEFAULT_TOKEN_FILE`] |
    pub fn from_env() -> Self {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let flag = |name: &str| {
            var(name).is_some_and(|v| {
                matches!(v.to_ascii_lowercase().as_str(), "true" | "1" | "yes" | "on")
            })
        };
        let mut credentials = if flag("KD_INSECURE") {
            Self::plaintext()
        } else {
            Self::tls(var("KD_TLS_CA_FILE").unwrap_or_else(|| DEFAULT_CA_FILE.to_owned()))
        };
        if let Some(name) = var("KD_TLS_SERVER_NAME") {
            credentials = credentials.with_server_name(name);
        }
        if let Some(name) = var("KD_LOADBALANCER_TLS_SERVER_NAME") {
            credentials = credentials.with_load_balancer_server_name(name);
        }
        if !flag("KD_ALLOW_ANONYMOUS") {
            credentials = credentials.with_token_file(
                var("KD_TOKEN_FILE").unwrap_or_else(|| DEFAULT_TOKEN_FILE.to_owned()),
            );
        }
        credentials
    }

    /// Whether calls go over TLS.
    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// The interceptor that adds the bearer credential to each call.
    pub fn bearer(&self) -> Bearer {
        self.token.clone()
    }

    /// An endpoint for `address` (`host:port`, or a URL whose scheme matches the transport),
    /// whose connection attempts give up after [`CONNECT_TIMEOUT`] unless the caller sets a
    /// timeout of its own: a black-holed address fails in seconds, not after the operating
    /// system's minutes.
    pub fn endpoint(&self, address: &str) -> Result<Endpoint, CredentialsError> {
        let (scheme, rest) = match address.split_once("://") {
            Some((scheme, rest)) => (Some(scheme), rest),
            None => (None, address),
        };
        let configured = if self.tls.is_some() { "https" } else { "http" };
        match scheme {
            None => {}
            Some(s) if s == configured => {}
            Some("http") | Some("https") => {
                return Err(CredentialsError::Scheme {
                    address: address.to_owned(),
                    asked: if scheme == Some("https") {
                        "TLS (https://)"
                    } else {
                        "plaintext (http://)"
                    },
                    configured: if self.tls.is_some() {
                        "TLS"
                    } else {
                        "plaintext"
                    },
                });
            }
            Some(other) => {
                return Err(CredentialsError::Address {
                    address: address.to_owned(),
                    detail: format!("unknown scheme {other:?}"),
                });
            }
        }
        let rest = rest.trim_end_matches('/');
        if rest.is_empty() || rest.contains('/') {
            return Err(CredentialsError::Address {
                address: address.to_owned(),
                detail: "expected host:port".into(),
            });
        }
        let endpoint = Endpoint::from_shared(format!("{configured}://{rest}"))
            .map_err(|e| CredentialsError::Address {
                address: address.to_owned(),
                detail: e.to_string(),
            })?
            .connect_timeout(CONNECT_TIMEOUT);
        let Some(tls) = &self.tls else {
            return Ok(endpoint);
        };
        let ca = match &tls.ca {
            Ca::File(path) => std::fs::read(path).map_err(|source| CredentialsError::Ca {
                path: path.clone(),
                source,
            })?,
            Ca::Pem(pem) => pem.to_vec(),
        };
        let mut config = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca));
        if let Some(name) = &tls.server_name {
            config = config.domain_name(name.clone());
        }
        Ok(endpoint.tls_config(config)?)
    }
}

/// Adds `authorization: Bearer <token>` to every call, from a fixed token or a file read again
/// at most every [`TOKEN_REREAD`]. Its `Debug` never shows the token.
#[derive(Clone)]
pub struct Bearer(Arc<Source>);

enum Source {
    None,
    Fixed(AsciiMetadataValue),
    File {
        path: PathBuf,
        read: Mutex<Option<(Instant, AsciiMetadataValue)>>,
    },
}

impl fmt::Debug for Bearer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &*self.0 {
            Source::None => f.write_str("Bearer(none)"),
            Source::Fixed(_) => f.write_str("Bearer(<token>)"),
            Source::File { path, .. } => write!(f, "Bearer(file {})", path.display()),
        }
    }
}

impl Bearer {
    fn none() -> Self {
        Self(Arc::new(Source::None))
    }

    fn fixed(token: String) -> Self {
        match header(token.trim()) {
            Some(value) => Self(Arc::new(Source::Fixed(value))),
            // Not a valid header value: sent as none, and the server says the credential is
            // missing.
            None => Self::none(),
        }
    }

    fn file(path: PathBuf) -> Self {
        Self(Arc::new(Source::File {
            path,
            read: Mutex::new(None),
        }))
    }

    /// The header value to send now.
    fn current(&self) -> Result<Option<AsciiMetadataValue>, Status> {
        match &*self.0 {
            Source::None => Ok(None),
            Source::Fixed(value) => Ok(Some(value.clone())),
            Source::File { path, read } => {
                let mut read = read.lock().unwrap_or_else(|e| e.into_inner());
                if let Some((at, value)) = &*read
                    && at.elapsed() < TOKEN_REREAD
                {
                    return Ok(Some(value.clone()));
                }
                match read_token(path) {
                    Ok(value) => {
                        *read = Some((Instant::now(), value.clone()));
                        Ok(Some(value))
                    }
                    // A rotation in progress: the previous token is still valid for a while.
                    Err(_) if read.is_some() => Ok(read.as_ref().map(|(_, v)| v.clone())),
                    Err(e) => Err(e),
                }
            }
        }
    }
}

fn header(token: &str) -> Option<AsciiMetadataValue> {
    if token.is_empty() {
        return None;
    }
    let mut value: AsciiMetadataValue = MetadataValue::try_from(format!("Bearer {token}")).ok()?;
    value.set_sensitive(true);
    Some(value)
}

fn read_token(path: &Path) -> Result<AsciiMetadataValue, Status> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        Status::unauthenticated(format!(
            "cannot read the token file {}: {e}",
            path.display()
        ))
    })?;
    header(text.trim()).ok_or_else(|| {
        Status::unauthenticated(format!(
            "the token file {} holds no usable token (empty, or not printable ASCII)",
            path.display()
        ))
    })
}

impl Interceptor for Bearer {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        if let Some(value) = self.current()? {
            request.metadata_mut().insert("authorization", value);
        }
        Ok(request)
    }
}

/// The host of `address` (`host:port`, with or without a scheme) when it is a name, not an IP.
fn host_name(address: &str) -> Option<String> {
    let rest = address.split_once("://").map_or(address, |(_, rest)| rest);
    let authority = rest.split('/').next().unwrap_or(rest);
    if authority.starts_with('[') {
        return None;
    }
    let host = authority
        .rsplit_once(':')
        .map_or(authority, |(host, _)| host);
    (!host.is_empty() && host.parse::<std::net::IpAddr>().is_err()).then(|| host.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_load_balancer_is_verified_under_its_own_name() {
        let name = |c: &Credentials| c.tls.as_ref().and_then(|t| t.server_name.clone());
        let base = Credentials::tls("ca.crt").with_server_name("dispatchers.svc");
        let lb = base.for_load_balancer("lb.ns.svc:7071");
        assert_eq!(name(&lb).as_deref(), Some("lb.ns.svc"));
        assert_eq!(name(&base).as_deref(), Some("dispatchers.svc"), "unchanged");
        assert_eq!(
            name(&base.for_load_balancer("https://lb.ns.svc:7071")).as_deref(),
            Some("lb.ns.svc")
        );
        assert_eq!(name(&base.for_load_balancer("10.0.0.1:7071")), None);
        assert_eq!(name(&base.for_load_balancer("[::1]:7071")), None);
        let set = base.with_load_balancer_server_name("lb.example");
        assert_eq!(
            name(&set.for_load_balancer("10.0.0.1:7071")).as_deref(),
            Some("lb.example")
        );
        assert!(
            Credentials::plaintext()
                .for_load_balancer("x:1")
                .tls
                .is_none()
        );
    }

    #[test]
    fn addresses_take_the_transports_scheme() {
        let plain = Credentials::plaintext();
        assert_eq!(
            plain.endpoint("127.0.0.1:7070").unwrap().uri().to_string(),
            "http://127.0.0.1:7070/"
        );
        assert_eq!(
            plain
                .endpoint("http://127.0.0.1:7070/")
                .unwrap()
                .uri()
                .to_string(),
            "http://127.0.0.1:7070/"
        );
        let err = plain.endpoint("https://127.0.0.1:7070").unwrap_err();
        assert!(
            err.to_string()
                .contains("asks for TLS (https://) but this client is configured for plaintext"),
            "{err}"
        );
        let tls = Credentials::tls("/nonexistent/ca.crt");
        let err = tls.endpoint("http://127.0.0.1:7070").unwrap_err();
        assert!(err.to_string().contains("configured for TLS"), "{err}");
        let err = tls.endpoint("127.0.0.1:7070").unwrap_err();
        assert!(
            err.to_string()
                .contains("cannot read the CA bundle /nonexistent/ca.crt"),
            "{err}"
        );
        assert!(plain.endpoint("grpc://x:1").is_err());
        assert!(plain.endpoint("x:1/path").is_err());
        assert!(plain.endpoint("").is_err());
    }

    #[test]
    fn the_token_is_sent_and_never_shown() {
        let mut bearer = Credentials::plaintext()
            .with_token("secret-token-value")
            .bearer();
        assert!(!format!("{bearer:?}").contains("secret"));
        let request = bearer.call(Request::new(())).unwrap();
        let value = request.metadata().get("authorization").unwrap();
        assert_eq!(value.to_str().unwrap(), "Bearer secret-token-value");
        assert!(!format!("{value:?}").contains("secret"), "{value:?}");
    }

    #[test]
    fn a_token_file_is_read_and_a_missing_one_named() {
        let dir = std::env::temp_dir().join(format!("kd-token-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("token");
        let mut missing = Credentials::plaintext().with_token_file(&path).bearer();
        let err = missing.call(Request::new(())).unwrap_err();
        assert_eq!(err.code(), tonic::Code::Unauthenticated);
        assert!(
            err.message().contains("cannot read the token file"),
            "{err}"
        );
        std::fs::write(&path, "from-file\n").unwrap();
        let mut bearer = Credentials::plaintext().with_token_file(&path).bearer();
        let request = bearer.call(Request::new(())).unwrap();
        assert_eq!(
            request.metadata().get("authorization").unwrap(),
            "Bearer from-file"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
