//! How kdctl finds the dispatchers and what it shows them: the dispatcher Leases name each
//! member and its address, and every call carries TLS and a ServiceAccount token like any other
//! client of the tier (`proto/kubedispatch/v1/security.md`).

use std::{path::PathBuf, time::Duration};

use anyhow::{Context as _, bail};
use k8s_openapi::api::{
    authentication::v1::{TokenRequest, TokenRequestSpec},
    coordination::v1::Lease,
    core::v1::{Pod, ServiceAccount},
};
use kube::{Api, Client, ResourceExt, api::ListParams};
use kube_dispatch_proto::{
    credentials::{AuthChannel, Credentials},
    lease::{ADDRESS_ANNOTATION, LEASE_LABEL},
    v1::operator_client::OperatorClient,
};

/// Where kdctl's token comes from.
#[derive(Clone, Debug)]
pub enum TokenSource {
    /// A file holding a token for the tier's audience.
    File(PathBuf),
    /// A short-lived token minted with TokenRequest for this ServiceAccount
    /// (`namespace`, `name`), as `kubectl create token` does.
    ServiceAccount {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
    },
    /// No token: for dispatchers run with `--allow-anonymous`.
    None,
}

/// How to reach the dispatchers.
#[derive(Clone, Debug)]
pub struct Target {
    /// Namespace of the dispatcher Leases.
    pub namespace: String,
    /// Dispatchers to ask, as `name=host:port` or `host:port`; empty: every Lease holder.
    pub dispatchers: Vec<String>,
    /// TLS (CA bundle, server name) or plaintext.
    pub credentials: Credentials,
    /// Where the token comes from.
    pub token: TokenSource,
    /// The audience minted tokens are for.
    pub audience: String,
    /// The longest one call may take (a drain waits longer: its own timeout).
    pub timeout: Duration,
}

/// One dispatcher: its name and address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    /// Its identity (the Lease name), or its address when given without one.
    pub name: String,
    /// `host:port`.
    pub address: String,
}

/// A connected kdctl: the Kubernetes client and the credentials every call carries.
#[derive(Clone)]
pub struct Connection {
    client: Client,
    target: Target,
    credentials: Credentials,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("target", &self.target)
            .finish_non_exhaustive()
    }
}

/// An Operator client with kdctl's credentials.
pub type Operator = OperatorClient<AuthChannel>;

impl Connection {
    /// Readies the credentials: mints a token when asked to.
    pub async fn new(client: Client, target: Target) -> anyhow::Result<Self> {
        let credentials = match &target.token {
            TokenSource::File(path) => target.credentials.clone().with_token_file(path),
            TokenSource::ServiceAccount { namespace, name } => {
                let token = mint_token(&client, namespace, name, &target.audience).await?;
                target.credentials.clone().with_token(token)
            }
            TokenSource::None => target.credentials.clone(),
        };
        Ok(Self {
            client,
            target,
            credentials,
        })
    }

    /// The Kubernetes client.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The longest one call may take.
    pub fn timeout(&self) -> Duration {
        self.target.timeout
    }

    /// The dispatchers to ask, sorted by name: those given, else every dispatcher Lease in the
    /// namespace that names an address.
    pub async fn members(&self) -> anyhow::Result<Vec<Member>> {
        if !self.target.dispatchers.is_empty() {
            let mut members: Vec<Member> = self
                .target
                .dispatchers
                .iter()
                .map(|d| match d.split_once('=') {
                    Some((name, address)) => Member {
                        name: name.to_owned(),
                        address: address.to_owned(),
                    },
                    None => Member {
                        name: d.clone(),
                        address: d.clone(),
                    },
                })
                .collect();
            members.sort_by(|a, b| a.name.cmp(&b.name));
            return Ok(members);
        }
        let namespace = &self.target.namespace;
        let leases: Api<Lease> = Api::namespaced(self.client.clone(), namespace);
        let list = leases
            .list(&ListParams::default().labels(&format!("{LEASE_LABEL}=true")))
            .await
            .with_context(|| {
                format!("cannot list the dispatcher Leases in namespace {namespace}")
            })?;
        let mut members: Vec<Member> = list
            .items
            .iter()
            .filter_map(|lease| {
                Some(Member {
                    name: lease.name_any(),
                    address: lease.annotations().get(ADDRESS_ANNOTATION)?.clone(),
                })
            })
            .collect();
        if members.is_empty() {
            bail!(
                "no dispatcher Lease (label {LEASE_LABEL}=true, with an address) in namespace {namespace}: are the dispatchers running there? (--namespace, or --dispatcher ADDRESS)"
            );
        }
        members.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(members)
    }

    /// Whether the dispatchers were named (--dispatcher) rather than found through their
    /// Leases.
    pub fn names_dispatchers(&self) -> bool {
        !self.target.dispatchers.is_empty()
    }

    /// The dispatcher `name` by its pod in --namespace, for one that has no Lease (a
    /// dispatcher drained cleanly deletes its own): the pod's IP and its container port named
    /// `grpc`, as deploy/ names it.
    pub async fn pod_member(&self, name: &str) -> anyhow::Result<Member> {
        let namespace = &self.target.namespace;
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        let pod = pods
            .get_opt(name)
            .await
            .with_context(|| format!("cannot read pod {namespace}/{name}"))?
            .with_context(|| {
                format!(
                    "no dispatcher {name:?}: no Lease and no pod of that name in namespace {namespace} (--dispatcher NAME=ADDRESS to name its address)"
                )
            })?;
        member_of_pod(&pod).with_context(|| {
            format!(
                "pod {namespace}/{name} has no IP or no container port named grpc: is it a running dispatcher? (--dispatcher NAME=ADDRESS to name its address)"
            )
        })
    }

    /// An Operator client for `member`.
    pub fn operator(&self, member: &Member) -> anyhow::Result<Operator> {
        let endpoint = self
            .credentials
            .endpoint(&member.address)
            .with_context(|| format!("bad address {:?} for {}", member.address, member.name))?
            .connect_timeout(self.target.timeout);
        Ok(OperatorClient::with_interceptor(
            endpoint.connect_lazy(),
            self.credentials.bearer(),
        ))
    }
}

/// A dispatcher pod as a member: its name, its IP and its container port named `grpc`.
fn member_of_pod(pod: &Pod) -> Option<Member> {
    let ip = pod.status.as_ref()?.pod_ip.as_deref()?;
    let port = pod
        .spec
        .as_ref()?
        .containers
        .iter()
        .flat_map(|c| c.ports.iter().flatten())
        .find(|p| p.name.as_deref() == Some("grpc"))?
        .container_port;
    let host = if ip.contains(':') {
        format!("[{ip}]")
    } else {
        ip.to_owned()
    };
    Some(Member {
        name: pod.name_any(),
        address: format!("{host}:{port}"),
    })
}

/// A token for the ServiceAccount `namespace/name` with `audience`, valid for 10 minutes (what
/// `kubectl create token` does).
pub async fn mint_token(
    client: &Client,
    namespace: &str,
    name: &str,
    audience: &str,
) -> anyhow::Result<String> {
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            audiences: Some(vec![audience.to_owned()]),
            expiration_seconds: Some(600),
            ..TokenRequestSpec::default()
        }),
        ..TokenRequest::default()
    };
    let minted = accounts
        .create_token_request(name, &Default::default(), &request)
        .await
        .with_context(|| {
            format!(
                "cannot create a token for ServiceAccount {namespace}/{name} (audience {audience}): it must exist and you must be allowed to create serviceaccounts/token there (--service-account, or --token-file)"
            )
        })?;
    minted
        .status
        .and_then(|s| s.token)
        .context("the API server answered the TokenRequest without a token")
}

/// The ConfigMap in which the tier publishes its CA bundle (key `ca.crt`): `deploy/tls.sh`
/// writes it in the tier's namespace and in each controller namespace it is told of.
pub const CA_CONFIGMAP: &str = "kube-dispatch-ca";

/// The dispatchers' serving Secret (`deploy/tls.sh` and the cert-manager component write it):
/// its `ca.crt` is the CA the tier's certificates chain to.
pub const DISPATCHER_TLS_SECRET: &str = "kube-dispatch-dispatcher-tls";

/// Where a CA bundle was found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FoundCa {
    /// The PEM bundle.
    pub pem: Vec<u8>,
    /// Where it came from, for the logs: `ConfigMap NS/NAME` or `Secret NS/NAME`.
    pub source: String,
}

/// The CA bundle the tier publishes in `namespace`: the `ca.crt` of ConfigMap
/// [`CA_CONFIGMAP`], else that of Secret [`DISPATCHER_TLS_SECRET`] (readable by whoever may
/// read Secrets there; only its `ca.crt` is used). Fails, saying what it tried and why each
/// failed, when neither holds one.
pub async fn discover_ca(client: &Client, namespace: &str) -> anyhow::Result<FoundCa> {
    use k8s_openapi::api::core::v1::{ConfigMap, Secret};
    let ca_of = |source: String, pem: Option<Vec<u8>>| -> Result<FoundCa, String> {
        match pem {
            Some(pem) if holds_certificate(&pem) => Ok(FoundCa { pem, source }),
            Some(_) => Err(format!(
                "{source} has a ca.crt with no PEM certificate in it"
            )),
            None => Err(format!("{source} holds no ca.crt")),
        }
    };
    // Absent or not readable by this user: look further; any other failure is the answer.
    let look_further = |e: &kube::Error| matches!(e, kube::Error::Api(status) if status.code == 404 || status.code == 403);
    let from_configmap = match Api::<ConfigMap>::namespaced(client.clone(), namespace)
        .get(CA_CONFIGMAP)
        .await
    {
        Ok(cm) => ca_of(
            format!("ConfigMap {namespace}/{CA_CONFIGMAP}"),
            cm.data
                .and_then(|mut d| d.remove("ca.crt"))
                .map(String::into_bytes),
        ),
        Err(e) if look_further(&e) => Err(format!("ConfigMap {namespace}/{CA_CONFIGMAP}: {e}")),
        Err(e) => {
            return Err(anyhow::Error::new(e).context(format!(
                "cannot read the tier's CA bundle, ConfigMap {namespace}/{CA_CONFIGMAP}"
            )));
        }
    };
    let configmap_error = match from_configmap {
        Ok(found) => return Ok(found),
        Err(e) => e,
    };
    let from_secret = match Api::<Secret>::namespaced(client.clone(), namespace)
        .get(DISPATCHER_TLS_SECRET)
        .await
    {
        Ok(secret) => ca_of(
            format!("Secret {namespace}/{DISPATCHER_TLS_SECRET}"),
            secret
                .data
                .and_then(|mut d| d.remove("ca.crt"))
                .map(|b| b.0),
        ),
        Err(e) => Err(format!("Secret {namespace}/{DISPATCHER_TLS_SECRET}: {e}")),
    };
    from_secret.map_err(|secret_error| {
        anyhow::anyhow!(
            "no --tls-ca-file given, and no CA bundle found in namespace {namespace} ({configmap_error}; {secret_error}): pass --tls-ca-file, or publish the CA as ConfigMap {CA_CONFIGMAP} there (deploy/tls.sh does)"
        )
    })
}

/// Whether `pem` holds at least one PEM certificate (a bundle with none would trust nothing,
/// and every dispatcher would then fail its handshake for a reason far from the cause).
fn holds_certificate(pem: &[u8]) -> bool {
    let text = String::from_utf8_lossy(pem);
    text.contains("-----BEGIN CERTIFICATE-----") && text.contains("-----END CERTIFICATE-----")
}

/// The name the dispatchers' certificate carries when deployed from `deploy/` in `namespace`:
/// their headless Service's.
pub fn dispatcher_server_name(namespace: &str) -> String {
    format!("kube-dispatch-dispatcher.{namespace}.svc")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(ip: Option<&str>, ports: &[(&str, i32)]) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "kube-dispatch-dispatcher-1"},
            "spec": {"containers": [{
                "name": "dispatcher",
                "ports": ports.iter().map(|(name, port)| serde_json::json!({"name": name, "containerPort": port})).collect::<Vec<_>>(),
            }]},
            "status": ip.map_or(serde_json::json!({}), |ip| serde_json::json!({"podIP": ip})),
        }))
        .expect("a pod")
    }

    #[test]
    fn a_pod_is_reached_at_its_ip_and_its_port_named_grpc() {
        let found = member_of_pod(&pod(Some("10.0.0.7"), &[("admin", 9070), ("grpc", 7070)]));
        assert_eq!(
            found,
            Some(Member {
                name: "kube-dispatch-dispatcher-1".into(),
                address: "10.0.0.7:7070".into(),
            })
        );
        let v6 = member_of_pod(&pod(Some("fd00::7"), &[("grpc", 7070)])).map(|m| m.address);
        assert_eq!(v6.as_deref(), Some("[fd00::7]:7070"));
        assert_eq!(
            member_of_pod(&pod(None, &[("grpc", 7070)])),
            None,
            "not scheduled yet"
        );
        assert_eq!(
            member_of_pod(&pod(Some("10.0.0.7"), &[("admin", 9070)])),
            None
        );
    }
}
