//! The Kubernetes client, from a kubeconfig flag or the environment.

use anyhow::Context as _;

/// A Kubernetes client from `kubeconfig`, else from the environment (in-cluster configuration,
/// `KUBECONFIG`, `~/.kube/config`).
pub async fn from_kubeconfig(kubeconfig: Option<&std::path::Path>) -> anyhow::Result<kube::Client> {
    let config = match kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("cannot read kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &Default::default())
                .await
                .with_context(|| format!("invalid kubeconfig {}", path.display()))?
        }
        None => kube::Config::infer().await.context(
            "no usable kubeconfig (--kubeconfig, KUBECONFIG or ~/.kube/config) and no \
                 in-cluster configuration",
        )?,
    };
    kube::Client::try_from(config).context("cannot build the Kubernetes client")
}
