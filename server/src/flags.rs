//! The security flags every kube-dispatch server takes, and what they turn into. Secure by
//! default: a server without a certificate refuses to start unless `--insecure` says
//! plaintext, and callers are authenticated unless `--allow-anonymous` says otherwise; both log
//! a warning at start.

use std::{num::NonZeroU32, path::PathBuf, time::Duration};

use kube_dispatch_proto::credentials::{Credentials, DEFAULT_AUDIENCE, DEFAULT_TOKEN_FILE};

use crate::{
    auth::{AuthConfig, GroupOwners},
    authz::AuthzConfig,
    bounds::ServerLimits,
    limits::RequestRate,
    tls::{ServerTls, Transport},
};

/// How a server serves: TLS and authentication.
#[derive(Clone, Debug, clap::Args)]
pub struct SecurityFlags {
    /// PEM certificate chain this server presents (the mounted TLS Secret's tls.crt); read
    /// again when it changes, without dropping open connections.
    #[arg(long, env = "KD_TLS_CERT_FILE")]
    pub tls_cert_file: Option<PathBuf>,

    /// PEM private key of --tls-cert-file (tls.key).
    #[arg(long, env = "KD_TLS_KEY_FILE")]
    pub tls_key_file: Option<PathBuf>,

    /// Serve and call PLAINTEXT: anyone on the network path reads and alters every call,
    /// tokens included. Logs a warning at start.
    #[arg(long, env = "KD_INSECURE", value_parser = clap::builder::BoolishValueParser::new())]
    pub insecure: bool,

    /// Take calls without authentication, and so without authorization: any caller that
    /// reaches the port reads every object this process can read. Logs a warning at start.
    #[arg(long, env = "KD_ALLOW_ANONYMOUS", value_parser = clap::builder::BoolishValueParser::new())]
    pub allow_anonymous: bool,

    /// Audience a caller's token must be issued for (repeat for several).
    #[arg(long = "token-audience", env = "KD_TOKEN_AUDIENCES", value_delimiter = ',', default_value = DEFAULT_AUDIENCE)]
    pub token_audiences: Vec<String>,

    /// Longest a verified token is trusted before it is reviewed again (TokenReview); never
    /// past the token's own expiry.
    #[arg(long, env = "KD_TOKEN_CACHE_TTL", default_value = "2m", value_parser = humantime::parse_duration)]
    pub token_cache_ttl: Duration,

    /// Most verified tokens remembered, and most access decisions (SubjectAccessReview).
    #[arg(long, env = "KD_AUTH_CACHE_SIZE", default_value_t = 10_000)]
    pub auth_cache_size: u64,

    /// Requests per second one identity may send this server, sustained; past it (and the
    /// burst) its calls get RESOURCE_EXHAUSTED while other identities are served as before.
    #[arg(long, env = "KD_MAX_REQUEST_RATE", default_value_t = RequestRate::default().per_second)]
    pub max_request_rate: NonZeroU32,

    /// Requests one identity may send at once after a quiet spell.
    #[arg(long, env = "KD_MAX_REQUEST_BURST", default_value_t = RequestRate::default().burst)]
    pub max_request_burst: NonZeroU32,

    /// Tokens not seen before that this server reviews per second (TokenReview), over all
    /// callers, in bursts of twice as many; past it, calls with new tokens get UNAVAILABLE with
    /// gRPC's pushback (1 s, which the SDKs' session loops wait out with jitter). Bounds what garbage tokens
    /// can make this server ask of the API server; after a restart every replica's token is new
    /// here, so it is also how fast the replicas come back (1 000 in 5 s at the default).
    #[arg(long, env = "KD_MAX_TOKEN_REVIEW_RATE", default_value_t = AuthConfig::default().review_rate.per_second)]
    pub max_token_review_rate: NonZeroU32,

    /// GROUP=USER: the controller group GROUP may be used by USER (repeat for several users
    /// and groups), and by no one else, whoever created it. A group not listed belongs to the
    /// user that created it. For a controller that runs under several ServiceAccounts.
    #[arg(long = "group-owner", env = "KD_GROUP_OWNERS", value_delimiter = ',', value_parser = group_owner)]
    pub group_owners: Vec<(String, String)>,
}

fn group_owner(pair: &str) -> Result<(String, String), String> {
    match pair.split_once('=') {
        Some((group, user)) if !group.trim().is_empty() && !user.trim().is_empty() => {
            Ok((group.trim().to_owned(), user.trim().to_owned()))
        }
        _ => Err(format!(
            "expected GROUP=USER, such as my-controller=system:serviceaccount:ns:name, not {pair:?}"
        )),
    }
}

/// How a server calls other kube-dispatch servers (a dispatcher its peers).
#[derive(Clone, Debug, clap::Args)]
pub struct CallFlags {
    /// PEM CA bundle that the servers this process calls must chain to (ca.crt).
    #[arg(long, env = "KD_TLS_CA_FILE")]
    pub tls_ca_file: Option<PathBuf>,

    /// Name the called dispatchers' certificate must carry, instead of the host of each address
    /// (Leases publish pod IPs; the certificate names the dispatchers' Service).
    #[arg(long, env = "KD_TLS_SERVER_NAME")]
    pub tls_server_name: Option<String>,

    /// ServiceAccount token this process sends when it calls another kube-dispatch server (a
    /// projected token for the audience its callers expect), read again as the kubelet rotates
    /// it.
    #[arg(long, env = "KD_TOKEN_FILE", default_value = DEFAULT_TOKEN_FILE)]
    pub token_file: PathBuf,
}

/// The transport bounds' flags, the same on every gRPC server.
#[derive(Clone, Debug, clap::Args)]
pub struct ServerFlags {
    /// Most connections this server holds open at once, from all peers; past it a new
    /// connection is closed at once.
    #[arg(long, env = "KD_MAX_CONNECTIONS", default_value_t = ServerLimits::default().max_connections)]
    pub max_connections: usize,

    /// Most connections open at once from one peer address; past it that peer's new
    /// connections are closed at once, while other peers connect as before. A controller
    /// replica holds one per dispatcher.
    #[arg(long, env = "KD_MAX_CONNECTIONS_PER_PEER", default_value_t = ServerLimits::default().max_connections_per_peer)]
    pub max_connections_per_peer: usize,

    /// Most calls at once on one connection (HTTP/2 streams); past it the stream is refused.
    #[arg(long, env = "KD_MAX_STREAMS_PER_CONNECTION", default_value_t = ServerLimits::default().max_streams_per_connection)]
    pub max_streams_per_connection: u32,

    /// Most calls at once that carry no credential (grpc.health.v1, for probes), over all
    /// peers; past it RESOURCE_EXHAUSTED. Authenticated calls never wait for these.
    #[arg(long, env = "KD_MAX_UNAUTHENTICATED_CALLS", default_value_t = ServerLimits::default().max_unauthenticated_calls)]
    pub max_unauthenticated_calls: usize,

    /// Longest a call may take to its answer; a long-poll waits far less (--max-poll-wait).
    #[arg(long, env = "KD_REQUEST_TIMEOUT", default_value = "2m", value_parser = humantime::parse_duration)]
    pub request_timeout: Duration,

    /// A connection older than this is asked to go away (GOAWAY): its calls finish and new
    /// ones go on a new connection, so no connection lives for ever and load spreads again.
    #[arg(long, env = "KD_MAX_CONNECTION_AGE", default_value = "30m", value_parser = humantime::parse_duration)]
    pub max_connection_age: Duration,

    /// An idle connection is pinged after this long (HTTP/2 keepalive) and closed when the
    /// ping is not answered within 10 s: a peer that vanished holds nothing for long.
    #[arg(long, env = "KD_KEEPALIVE_INTERVAL", default_value = "30s", value_parser = humantime::parse_duration)]
    pub keepalive_interval: Duration,
}

impl ServerFlags {
    /// The bounds these flags set; a zero count or duration is an error.
    pub fn limits(&self) -> Result<ServerLimits, FlagError> {
        use FlagError::Zero;
        if self.max_connections == 0 {
            return Err(Zero("--max-connections"));
        }
        if self.max_connections_per_peer == 0 {
            return Err(Zero("--max-connections-per-peer"));
        }
        if self.max_streams_per_connection == 0 {
            return Err(Zero("--max-streams-per-connection"));
        }
        if self.max_unauthenticated_calls == 0 {
            return Err(Zero("--max-unauthenticated-calls"));
        }
        for (name, d) in [
            ("--request-timeout", self.request_timeout),
            ("--max-connection-age", self.max_connection_age),
            ("--keepalive-interval", self.keepalive_interval),
        ] {
            if d.is_zero() {
                return Err(Zero(name));
            }
        }
        Ok(ServerLimits {
            max_connections: self.max_connections,
            max_connections_per_peer: self.max_connections_per_peer,
            max_streams_per_connection: self.max_streams_per_connection,
            max_unauthenticated_calls: self.max_unauthenticated_calls,
            request_timeout: self.request_timeout,
            max_connection_age: self.max_connection_age,
            keepalive_interval: self.keepalive_interval,
            ..ServerLimits::default()
        })
    }
}

/// Flags that contradict each other or are missing.
#[derive(Debug, thiserror::Error)]
pub enum FlagError {
    /// Neither a certificate nor --insecure.
    #[error(
        "no serving certificate: set --tls-cert-file and --tls-key-file (a mounted TLS Secret), or --insecure to serve plaintext"
    )]
    NoCertificate,
    /// A certificate and --insecure at once.
    #[error("--insecure contradicts --tls-cert-file/--tls-key-file: choose one")]
    Contradiction,
    /// Only one of certificate and key.
    #[error("--tls-cert-file and --tls-key-file go together")]
    HalfCertificate,
    /// Group owners listed while nobody is identified.
    #[error("--group-owner needs authentication: it contradicts --allow-anonymous")]
    OwnersWithoutAuthentication,
    /// Calls to other servers over TLS need a CA bundle.
    #[error(
        "no CA bundle to verify the servers this process calls: set --tls-ca-file (or --insecure)"
    )]
    NoCa,
    /// A zero duration or size.
    #[error("{0} must be greater than zero")]
    Zero(&'static str),
}

impl SecurityFlags {
    /// How this process serves.
    pub fn transport(&self) -> Result<Transport, FlagError> {
        match (&self.tls_cert_file, &self.tls_key_file, self.insecure) {
            (None, None, true) => Ok(Transport::Plaintext),
            (Some(_), _, true) | (_, Some(_), true) => Err(FlagError::Contradiction),
            (Some(cert), Some(key), false) => Ok(Transport::Tls(ServerTls::new(cert, key))),
            (None, None, false) => Err(FlagError::NoCertificate),
            _ => Err(FlagError::HalfCertificate),
        }
    }

    /// How callers are authenticated; `None` with --allow-anonymous.
    pub fn authentication(&self) -> Result<Option<AuthConfig>, FlagError> {
        if self.allow_anonymous {
            return Ok(None);
        }
        if self.token_cache_ttl.is_zero() {
            return Err(FlagError::Zero("--token-cache-ttl"));
        }
        if self.auth_cache_size == 0 {
            return Err(FlagError::Zero("--auth-cache-size"));
        }
        Ok(Some(AuthConfig {
            audiences: self.token_audiences.clone(),
            cache_ttl: self.token_cache_ttl,
            cache_capacity: self.auth_cache_size,
            rate: RequestRate {
                per_second: self.max_request_rate,
                burst: self.max_request_burst,
            },
            review_rate: RequestRate {
                per_second: self.max_token_review_rate,
                burst: self
                    .max_token_review_rate
                    .saturating_mul(NonZeroU32::new(2).expect("non-zero")),
            },
            ..AuthConfig::default()
        }))
    }

    /// Who may use the groups listed with --group-owner.
    pub fn group_owners(&self) -> Result<GroupOwners, FlagError> {
        if self.allow_anonymous && !self.group_owners.is_empty() {
            return Err(FlagError::OwnersWithoutAuthentication);
        }
        Ok(GroupOwners::from_pairs(self.group_owners.iter().cloned()))
    }

    /// How read access is checked: decisions trusted for `recheck`.
    pub fn authorization(&self, recheck: Duration) -> Result<AuthzConfig, FlagError> {
        if recheck.is_zero() {
            return Err(FlagError::Zero("--authorization-recheck"));
        }
        Ok(AuthzConfig {
            recheck,
            cache_capacity: self.auth_cache_size,
            ..AuthzConfig::default()
        })
    }
}

impl CallFlags {
    /// How this process calls other kube-dispatch servers, which serve as `serving` says: TLS
    /// against --tls-ca-file with the token in --token-file, or plaintext with --insecure (the
    /// token is still sent unless --allow-anonymous).
    pub fn credentials(&self, serving: &SecurityFlags) -> Result<Credentials, FlagError> {
        let credentials = if serving.insecure {
            Credentials::plaintext()
        } else {
            let ca = self.tls_ca_file.as_ref().ok_or(FlagError::NoCa)?;
            let mut c = Credentials::tls(ca);
            if let Some(name) = &self.tls_server_name {
                c = c.with_server_name(name);
            }
            c
        };
        Ok(if serving.allow_anonymous {
            credentials
        } else {
            credentials.with_token_file(&self.token_file)
        })
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        security: SecurityFlags,
        #[command(flatten)]
        calls: CallFlags,
    }

    fn cli(args: &[&str]) -> Cli {
        Cli::parse_from(std::iter::once("server").chain(args.iter().copied()))
    }

    fn flags(args: &[&str]) -> SecurityFlags {
        cli(args).security
    }

    fn credentials(args: &[&str]) -> Result<Credentials, FlagError> {
        let cli = cli(args);
        cli.calls.credentials(&cli.security)
    }

    #[test]
    fn secure_unless_told_otherwise() {
        let none = flags(&[]);
        assert!(matches!(none.transport(), Err(FlagError::NoCertificate)));
        assert_eq!(
            none.authentication().unwrap().unwrap().audiences,
            ["kube-dispatch"]
        );
        assert!(matches!(
            flags(&["--insecure"]).transport(),
            Ok(Transport::Plaintext)
        ));
        assert!(matches!(
            flags(&["--insecure", "--tls-cert-file", "c", "--tls-key-file", "k"]).transport(),
            Err(FlagError::Contradiction)
        ));
        assert!(matches!(
            flags(&["--tls-cert-file", "c"]).transport(),
            Err(FlagError::HalfCertificate)
        ));
        assert!(matches!(
            flags(&["--tls-cert-file", "c", "--tls-key-file", "k"]).transport(),
            Ok(Transport::Tls(_))
        ));
        assert!(
            flags(&["--allow-anonymous"])
                .authentication()
                .unwrap()
                .is_none()
        );
        assert!(flags(&[]).group_owners().unwrap().is_empty());
        let listed = flags(&["--group-owner", "g=u1", "--group-owner", "g=u2"]);
        assert!(
            listed
                .group_owners()
                .unwrap()
                .group_id("g", Some("u2"))
                .is_ok_and(|id| id.owner.is_none())
        );
        assert!(matches!(
            flags(&["--group-owner", "g=u", "--allow-anonymous"]).group_owners(),
            Err(FlagError::OwnersWithoutAuthentication)
        ));
        assert!(Cli::try_parse_from(["server", "--group-owner", "no-user"]).is_err());
        assert!(matches!(credentials(&[]), Err(FlagError::NoCa)));
        assert!(credentials(&["--tls-ca-file", "ca"]).unwrap().is_tls());
        assert!(!credentials(&["--insecure"]).unwrap().is_tls());
    }

    #[test]
    fn the_defaults_are_the_libraries() {
        let f = flags(&[]);
        let (auth, authz) = (AuthConfig::default(), AuthzConfig::default());
        let got = f.authentication().unwrap().unwrap();
        assert_eq!(
            (got.cache_ttl, got.cache_capacity, got.refusal_ttl, got.rate),
            (
                auth.cache_ttl,
                auth.cache_capacity,
                auth.refusal_ttl,
                auth.rate
            )
        );
        let got = f.authorization(authz.recheck).unwrap();
        assert_eq!(
            (got.recheck, got.cache_capacity),
            (authz.recheck, authz.cache_capacity)
        );
    }

    #[derive(Parser)]
    struct ServerCli {
        #[command(flatten)]
        server: ServerFlags,
    }

    #[test]
    fn the_server_flag_defaults_are_the_library_defaults() {
        let flags = ServerCli::parse_from(["server"]).server;
        assert_eq!(flags.limits().unwrap(), ServerLimits::default());
        let zero = ServerCli::parse_from(["server", "--max-connections-per-peer", "0"]).server;
        assert!(zero.limits().is_err());
    }
}
