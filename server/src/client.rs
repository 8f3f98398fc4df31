//! The Kubernetes client, from a kubeconfig flag or the environment.

use anyhow::Context as _;

/// A Kubernetes client from `kubeconfig`; else from the files `KUBECONFIG` names, read as
/// kubectl reads the variable (a list of files merged, empty as unset); else from
/// `~/.kube/config`, or the in-cluster configuration when that is missing.
///
/// A `KUBECONFIG` that names a file that cannot be read is an error, never a fall back to the
/// in-cluster configuration: a mistyped or unmounted kubeconfig must not send a process in a
/// pod to the pod's own cluster.
pub async fn from_kubeconfig(kubeconfig: Option<&std::path::Path>) -> anyhow::Result<kube::Client> {
    let named = match kubeconfig {
        Some(path) => Some((
            kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("cannot read kubeconfig {}", path.display()))?,
            path.display().to_string(),
        )),
        None => {
            let listed = std::env::var_os("KUBECONFIG").unwrap_or_default();
            let listed = listed.to_string_lossy();
            kube::config::Kubeconfig::from_env()
                .with_context(|| format!("cannot read KUBECONFIG {listed}"))?
                .map(|kc| (kc, format!("KUBECONFIG {listed}")))
        }
    };
    let config = match named {
        Some((kc, from)) => kube::Config::from_custom_kubeconfig(kc, &Default::default())
            .await
            .with_context(|| format!("invalid kubeconfig ({from})"))?,
        None => kube::Config::infer().await.context(
            "no kubeconfig (--kubeconfig, KUBECONFIG or ~/.kube/config) and no in-cluster \
             configuration",
        )?,
    };
    kube::Client::try_from(config).context("cannot build the Kubernetes client")
}
