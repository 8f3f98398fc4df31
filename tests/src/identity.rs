//! Identities for tests and benchmarks: ServiceAccounts of a test namespace with a Role on its
//! ConfigMaps, and their tokens from TokenRequest.

use k8s_openapi::api::{
    core::v1::ServiceAccount,
    rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject},
};
use kube::api::{Api, ObjectMeta, PostParams};

use crate::TestNamespace;

/// A ServiceAccount `name` in `ns`, with a Role of `verbs` on ConfigMaps there when given.
pub async fn account(ns: &TestNamespace, name: &str, verbs: &[&str]) -> Result<(), kube::Error> {
    let client = ns.client();
    let pp = PostParams::default();
    let meta = |name: &str| ObjectMeta {
        name: Some(name.to_owned()),
        namespace: Some(ns.name().to_owned()),
        ..ObjectMeta::default()
    };
    Api::<ServiceAccount>::namespaced(client.clone(), ns.name())
        .create(
            &pp,
            &ServiceAccount {
                metadata: meta(name),
                ..ServiceAccount::default()
            },
        )
        .await?;
    if verbs.is_empty() {
        return Ok(());
    }
    Api::<Role>::namespaced(client.clone(), ns.name())
        .create(
            &pp,
            &Role {
                metadata: meta(name),
                rules: Some(vec![PolicyRule {
                    api_groups: Some(vec![String::new()]),
                    resources: Some(vec!["configmaps".into()]),
                    verbs: verbs.iter().map(|v| (*v).to_owned()).collect(),
                    ..PolicyRule::default()
                }]),
            },
        )
        .await?;
    Api::<RoleBinding>::namespaced(client, ns.name())
        .create(
            &pp,
            &RoleBinding {
                metadata: meta(name),
                role_ref: RoleRef {
                    api_group: Some("rbac.authorization.k8s.io".into()),
                    kind: "Role".into(),
                    name: name.to_owned(),
                },
                subjects: Some(vec![Subject {
                    kind: "ServiceAccount".into(),
                    name: name.to_owned(),
                    namespace: Some(ns.name().to_owned()),
                    ..Subject::default()
                }]),
            },
        )
        .await?;
    Ok(())
}

/// A token of ServiceAccount `name` in `ns` for `audience`, as kdctl mints its own.
pub async fn token(ns: &TestNamespace, name: &str, audience: &str) -> anyhow::Result<String> {
    kdctl::connect::mint_token(&ns.client(), ns.name(), name, audience).await
}
