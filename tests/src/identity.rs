//! Identities for tests and benchmarks: ServiceAccounts of a test namespace with a Role on its
//! ConfigMaps, and their tokens from TokenRequest.

use k8s_openapi::api::{
    core::v1::ServiceAccount,
    rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject},
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
                role_ref: role_ref("Role", name),
                subjects: Some(service_account(ns, name)),
            },
        )
        .await?;
    Ok(())
}

/// Grants ServiceAccount `name` of `ns` `verb` on the non-resource `path` (the operator API's
/// authorization), with a ClusterRole and binding named after both.
pub async fn grant_path(
    ns: &TestNamespace,
    name: &str,
    verb: &str,
    path: &str,
) -> Result<(), kube::Error> {
    let client = ns.client();
    let pp = PostParams::default();
    let role = format!("{}-{name}-{verb}", ns.name());
    let meta = ObjectMeta {
        name: Some(role.clone()),
        ..ObjectMeta::default()
    };
    Api::<ClusterRole>::all(client.clone())
        .create(
            &pp,
            &ClusterRole {
                metadata: meta.clone(),
                rules: Some(vec![PolicyRule {
                    non_resource_urls: Some(vec![path.to_owned()]),
                    verbs: vec![verb.to_owned()],
                    ..PolicyRule::default()
                }]),
                ..ClusterRole::default()
            },
        )
        .await?;
    Api::<ClusterRoleBinding>::all(client)
        .create(
            &pp,
            &ClusterRoleBinding {
                metadata: meta,
                role_ref: role_ref("ClusterRole", &role),
                subjects: Some(service_account(ns, name)),
            },
        )
        .await?;
    Ok(())
}

fn role_ref(kind: &str, name: &str) -> RoleRef {
    RoleRef {
        api_group: Some("rbac.authorization.k8s.io".into()),
        kind: kind.into(),
        name: name.to_owned(),
    }
}

/// The subjects naming ServiceAccount `name` of `ns`.
fn service_account(ns: &TestNamespace, name: &str) -> Vec<Subject> {
    vec![Subject {
        kind: "ServiceAccount".into(),
        name: name.to_owned(),
        namespace: Some(ns.name().to_owned()),
        ..Subject::default()
    }]
}

/// A token of ServiceAccount `name` in `ns` for `audience`, as kdctl mints its own.
pub async fn token(ns: &TestNamespace, name: &str, audience: &str) -> anyhow::Result<String> {
    kdctl::connect::mint_token(&ns.client(), ns.name(), name, audience).await
}

/// The audience of tokens the test API server takes (its service-account issuer).
pub const API_AUDIENCE: &str = "https://kubernetes.default.svc.cluster.local";

/// A token of the test identity ([`crate::TESTER`], bound to cluster-admin) for the API server
/// itself, made with the admin `client`: what a dispatcher reaching the API server as an
/// identity priority and fairness can hold back uses (`tokens/tester.token` is for the tier's
/// audience, which the API server refuses).
pub async fn tester_api_token(client: &kube::Client) -> anyhow::Result<String> {
    kdctl::connect::mint_token(client, "kube-dispatch-tests", "tester", API_AUDIENCE).await
}
