//! The `kdctl` binary: flags, output and exit codes; the rest is the library.

use std::{path::PathBuf, process::ExitCode, time::Duration};

use anyhow::{Context as _, bail};
use clap::{Parser, Subcommand, ValueEnum};
use kdctl::{
    command,
    connect::{self, Connection, Target, TokenSource},
    view::Render,
};
use kube_dispatch_proto::credentials::Credentials;

/// Exit status when the command did what was asked and everything it saw is healthy.
const OK: u8 = 0;
/// Exit status when the command could not do what was asked (nothing found, refused, a drain
/// that did not complete cleanly). Usage errors exit with 2.
const FAILED: u8 = 1;
/// Exit status when the answer is complete but shows a problem: a dispatcher that did not
/// answer, a handover under way, dispatchers that disagree on the ring.
const DEGRADED: u8 = 3;

/// kdctl: see inside a kube-dispatch tier and operate it.
///
/// Finds the dispatchers through their Leases (label kube-dispatch.dev/dispatcher=true in
/// --namespace, read with your kubeconfig) and calls each one's operator API over TLS with a
/// ServiceAccount token, as every client of the tier does. By default the token is minted for
/// the ServiceAccount --service-account (you need the right to create serviceaccounts/token
/// there); that account needs a ClusterRole granting `get` on the non-resource URL
/// /kube-dispatch/status (status, owner), `post` on /kube-dispatch/drain (drain, undrain) and
/// `post` on /kube-dispatch/reconcile (reconcile), as deploy/base/kdctl-rbac.yaml defines.
///
/// The dispatchers' CA bundle is --tls-ca-file, else the one the tier publishes in --namespace:
/// ConfigMap kube-dispatch-ca (deploy/tls.sh writes it; with cert-manager, publish it as
/// deploy/components/cert-manager says), else the ca.crt of the dispatchers' serving Secret
/// kube-dispatch-dispatcher-tls (for those who may read Secrets there). The name checked on the
/// certificates of the dispatchers the Leases name is kube-dispatch-dispatcher.NAMESPACE.svc
/// (the one deploy/ gives them), of those given with --dispatcher their address's host, unless
/// --tls-server-name says otherwise. So with a kubeconfig alone: `kdctl status`.
///
/// Exit status: 0 done and healthy; 1 could not do what was asked; 2 bad usage; 3 answered,
/// with a problem shown (a dispatcher unreachable, a handover under way, rings that differ).
///
/// Every flag can also be set through the environment variable named in brackets. Durations
/// take units: 500ms, 10s, 5m.
#[derive(Debug, Parser)]
#[command(name = "kdctl", version = kube_dispatch_telemetry::version(), about, long_about)]
struct Args {
    #[command(subcommand)]
    command: Command,

    /// Output: a table for people, or JSON for scripts (the same fields).
    #[arg(short, long, global = true, value_enum, default_value_t = Output::Table)]
    output: Output,

    /// Path to the kubeconfig; defaults to KUBECONFIG (a list of files, merged; empty as
    /// unset), ~/.kube/config or the in-cluster configuration.
    #[arg(long, global = true)]
    kubeconfig: Option<PathBuf>,

    /// Namespace of the dispatcher Leases (the dispatchers' namespace).
    #[arg(
        short,
        long,
        global = true,
        env = "KD_LEASE_NAMESPACE",
        default_value = "kube-dispatch"
    )]
    namespace: String,

    /// Ask this dispatcher instead of those the Leases name: [NAME=]HOST:PORT, repeated (for
    /// example through `kubectl port-forward`).
    #[arg(long = "dispatcher", global = true, value_name = "[NAME=]HOST:PORT")]
    dispatchers: Vec<String>,

    /// CA bundle (PEM) the dispatchers' certificates chain to. Default: the one the tier
    /// publishes in --namespace (ConfigMap kube-dispatch-ca, else the ca.crt of Secret
    /// kube-dispatch-dispatcher-tls).
    #[arg(long, global = true, env = "KD_TLS_CA_FILE")]
    tls_ca_file: Option<PathBuf>,

    /// The name the dispatchers' certificates carry, checked instead of the address's host.
    /// Default: kube-dispatch-dispatcher.NAMESPACE.svc for the dispatchers the Leases name (pod
    /// IPs), the host of each address given with --dispatcher.
    #[arg(long, global = true, env = "KD_TLS_SERVER_NAME")]
    tls_server_name: Option<String>,

    /// Plaintext, for dispatchers run with --insecure only: anyone on the path reads the calls
    /// and the token.
    #[arg(long, global = true, env = "KD_INSECURE")]
    insecure: bool,

    /// A file holding a token for the tier's audience, instead of minting one.
    #[arg(
        long,
        global = true,
        env = "KD_TOKEN_FILE",
        conflicts_with = "allow_anonymous"
    )]
    token_file: Option<PathBuf>,

    /// The ServiceAccount (NAMESPACE/NAME) a token is minted for, valid 10 minutes.
    #[arg(
        long,
        global = true,
        env = "KD_SERVICE_ACCOUNT",
        default_value = "kube-dispatch/kdctl",
        value_name = "NAMESPACE/NAME"
    )]
    service_account: String,

    /// The audience of a minted token: the dispatchers' --token-audience.
    #[arg(
        long,
        global = true,
        env = "KD_TOKEN_AUDIENCE",
        default_value = "kube-dispatch"
    )]
    token_audience: String,

    /// Send no token, for dispatchers run with --allow-anonymous.
    #[arg(long, global = true, env = "KD_ALLOW_ANONYMOUS")]
    allow_anonymous: bool,

    /// The longest one call to a dispatcher may take.
    #[arg(long, global = true, default_value = "10s", value_parser = humantime::parse_duration)]
    timeout: Duration,
}

#[derive(Clone, Debug, Subcommand)]
enum Command {
    /// Each dispatcher's state, ring and slice share, each group's queue on each dispatcher
    /// (keys, ready, in flight, backing off, held, sessions and their replicas), and which
    /// replica of each group polls which dispatchers (the load balancer's placements, as the
    /// dispatchers' sessions show them).
    Status,
    /// Which dispatcher owns a key, and where it stands in each group there: idle, queued for
    /// which replica, in flight on which replica and for how long, backing off until when.
    Owner {
        /// The kind: a Kind or plural, optionally with its API group (ConfigMap, configmaps,
        /// deployments.apps).
        resource: String,
        /// NAMESPACE/NAME, or NAME for a cluster-scoped kind.
        name: String,
    },
    /// Reconciles one object now, through the tier: the dispatcher that serves its key queues
    /// it in each group that knows it (reason TRIGGERED), under the same exclusivity and
    /// coalescing as a change (in flight, it runs once more after). Shows where the key then
    /// stands, as `owner` does. A key no group knows is not added: exit status 1.
    Reconcile {
        /// The kind: a Kind or plural, optionally with its API group (ConfigMap, configmaps,
        /// deployments.apps).
        resource: String,
        /// NAMESPACE/NAME, or NAME for a cluster-scoped kind.
        name: String,
    },
    /// Hands a dispatcher's slice over to the others before maintenance: it hands nothing more
    /// out, waits for its reconciles in flight, releases its Lease and closes its sessions;
    /// kdctl then waits until every other dispatcher serves the ring without it, and says so.
    /// The dispatcher stays out of the ring until it restarts, or until `kdctl undrain`.
    Drain {
        /// The dispatcher, by name (for example dispatcher-2).
        dispatcher: String,
        /// The longest to wait for the drain and for the others to settle.
        #[arg(long = "drain-timeout", default_value = "5m", value_parser = humantime::parse_duration)]
        drain_timeout: Duration,
    },
    /// Brings a drained dispatcher back into the ring without a restart: it rejoins as a
    /// process that starts does (its Lease written again, its keys handed over to it; if its
    /// drain left reconciles in flight, it hands nothing out until their replicas report them
    /// ended, or the bound T has passed).
    /// kdctl then waits until every dispatcher, it included, serves one ring with it, and says
    /// so. A dispatcher that was not drained is left as it is. A dispatcher drained cleanly has
    /// no Lease: kdctl finds it by its pod in --namespace (it needs `get` on pods there), or
    /// give its address with --dispatcher NAME=ADDRESS. Needs the same right as drain.
    Undrain {
        /// The dispatcher, by name (for example dispatcher-2).
        dispatcher: String,
        /// The longest to wait for the dispatchers to settle on a ring with it.
        #[arg(long, default_value = "5m", value_parser = humantime::parse_duration)]
        timeout: Duration,
    },
    /// kdctl's version and each dispatcher's (more than one version among the dispatchers is
    /// shown as a problem: a rolling update under way, or stopped halfway). `kdctl --version`
    /// prints kdctl's alone, without asking the tier.
    Version,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Output {
    Table,
    Json,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args = Args::parse();
    match run(args).await {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("kdctl: {e:#}");
            ExitCode::from(FAILED)
        }
    }
}

async fn run(args: Args) -> anyhow::Result<u8> {
    let json = args.output == Output::Json;
    let asked = args.command.clone();
    let connection = connect(args).await?;
    act(&connection, asked, json).await
}

/// The connection `args` describe: the token, the CA bundle and the dispatchers.
async fn connect(args: Args) -> anyhow::Result<Connection> {
    // Usage first, before anything is asked of the cluster.
    let token = match (&args.token_file, args.allow_anonymous) {
        (Some(path), _) => TokenSource::File(path.clone()),
        (None, true) => TokenSource::None,
        (None, false) => {
            let Some((namespace, name)) = args.service_account.split_once('/') else {
                bail!(
                    "--service-account must be NAMESPACE/NAME, not {:?}",
                    args.service_account
                );
            };
            TokenSource::ServiceAccount {
                namespace: namespace.to_owned(),
                name: name.to_owned(),
            }
        }
    };
    let client = kube_dispatch_server::client::from_kubeconfig(args.kubeconfig.as_deref()).await?;
    let credentials = if args.insecure {
        Credentials::plaintext()
    } else {
        let credentials = match &args.tls_ca_file {
            Some(ca) => Credentials::tls(ca),
            None => {
                let found = connect::discover_ca(&client, &args.namespace).await?;
                eprintln!("kdctl: the tier's CA bundle from {}", found.source);
                Credentials::tls_pem(found.pem)
            }
        };
        match &args.tls_server_name {
            Some(name) => credentials.with_server_name(name),
            // The Leases give pod IPs; the certificate deploy/ gives the dispatchers names
            // their Service. An address given with --dispatcher is checked as it is.
            None if args.dispatchers.is_empty() => {
                credentials.with_server_name(connect::dispatcher_server_name(&args.namespace))
            }
            None => credentials,
        }
    };
    Connection::new(
        client,
        Target {
            namespace: args.namespace,
            dispatchers: args.dispatchers,
            credentials,
            token,
            audience: args.token_audience,
            timeout: args.timeout,
        },
    )
    .await
}

/// Runs `command` over `connection`, printing its view: the exit status.
async fn act(connection: &Connection, asked: Command, json: bool) -> anyhow::Result<u8> {
    match asked {
        Command::Status => {
            let view = command::status(connection).await?;
            print(&view, json)?;
            Ok(if view.healthy { OK } else { DEGRADED })
        }
        Command::Owner { resource, name } => {
            let key = command::request_key(connection, &resource, &name).await?;
            let view = command::owner(connection, &key).await?;
            print(&view, json)?;
            Ok(
                if view.owner.is_empty() || view.answers.iter().any(|a| a.error.is_some()) {
                    DEGRADED
                } else {
                    OK
                },
            )
        }
        Command::Reconcile { resource, name } => {
            let key = command::request_key(connection, &resource, &name).await?;
            let view = command::reconcile(connection, &key).await?;
            print(&view, json)?;
            Ok(reconciled(&view, &key))
        }
        Command::Version => {
            let view = command::version(connection).await?;
            print(&view, json)?;
            Ok(if view.problems.is_empty() {
                OK
            } else {
                DEGRADED
            })
        }
        Command::Drain {
            dispatcher,
            drain_timeout,
        } => {
            let view = command::drain(connection, &dispatcher, drain_timeout).await?;
            print(&view, json)?;
            Ok(if view.problems.is_empty() { OK } else { FAILED })
        }
        Command::Undrain {
            dispatcher,
            timeout,
        } => {
            let view = command::undrain(connection, &dispatcher, timeout).await?;
            print(&view, json)?;
            Ok(if view.problems.is_empty() { OK } else { FAILED })
        }
    }
}

/// The exit status of `kdctl reconcile`, saying why when nothing was queued.
fn reconciled(view: &kdctl::view::OwnerView, key: &kube_dispatch_proto::RequestKey) -> u8 {
    match view.answers.iter().find(|a| a.served) {
        None if view.answers.iter().any(|a| a.error.is_some()) => {
            eprintln!(
                "kdctl: no dispatcher that answered serves {key}; one that did not answer may (see above): nothing was queued that kdctl knows of"
            );
            FAILED
        }
        None => {
            eprintln!(
                "kdctl: no dispatcher serves {key} now (a handover or a drain under way): nothing was queued; ask again"
            );
            FAILED
        }
        Some(a) if !view.places.iter().any(|p| p.dispatcher == a.dispatcher) => {
            eprintln!(
                "kdctl: no group on {} knows {key} (or you may not get its objects): nothing was queued",
                a.dispatcher
            );
            FAILED
        }
        Some(_) if view.answers.iter().any(|a| a.error.is_some()) => DEGRADED,
        Some(_) => OK,
    }
}

fn print<V: Render + serde::Serialize>(view: &V, json: bool) -> anyhow::Result<()> {
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(view).context("cannot write the answer as JSON")?
        );
    } else {
        print!("{}", view.table());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory as _;

    use super::Args;

    /// Every file of the repository `--help` names exists.
    #[test]
    fn the_files_the_help_names_exist() {
        let help = Args::command().render_long_help().to_string();
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let named: Vec<&str> = help
            .split(|c: char| c.is_whitespace() || c == '(' || c == ')' || c == ',')
            .map(|word| word.trim_end_matches(['.', ':', ';']))
            .filter(|word| word.starts_with("deploy/"))
            .collect();
        assert!(
            !named.is_empty(),
            "the help names no file of deploy/:\n{help}"
        );
        for path in named {
            assert!(
                root.join(path).exists(),
                "--help names {path}, which does not exist"
            );
        }
    }
}
