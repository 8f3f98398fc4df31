//! The API server's priority and fairness turned against one identity: its LISTs of chosen
//! resources refused with 429, as an API server under pressure sheds them, while its watches,
//! Lease writes and reviews go through.

use k8s_openapi::api::flowcontrol::v1::{FlowSchema, PriorityLevelConfiguration};
use kube::{
    Api,
    api::{DeleteParams, PostParams},
};
use tokio_util::sync::CancellationToken;

use crate::{Cluster, TestResult};

/// A priority level with no seat that rejects what it cannot run at once, and a flow schema
/// that sends it one identity's LISTs of the resources its rules name (and nothing else). A
/// level with no seat still runs one request while none runs, so the identity keeps one
/// running: a list at a resourceVersion the API server has not reached, which it holds 3 s
/// before answering 504, asked again at once. The identity's own lists are refused with 429
/// meanwhile, but for the millisecond between two.
pub struct RefusedLists {
    client: kube::Client,
    name: String,
    occupier: tokio::task::JoinHandle<()>,
    stop: CancellationToken,
    /// Refusals the API server had counted under this name before (its counters outlive the
    /// objects).
    before: u64,
}

impl std::fmt::Debug for RefusedLists {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RefusedLists")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl RefusedLists {
    /// Refuses the LISTs by `subject` (a FlowSchema subject, e.g. a ServiceAccount) that match
    /// `resource_rules` (FlowSchema resource rules with the verb `list`), under the objects'
    /// `name`, made with the admin `client`. The occupier asks `occupy_path` (a list) as the
    /// identity whose bearer token is `token`.
    pub async fn install(
        client: kube::Client,
        name: &str,
        (subject, resource_rules): (serde_json::Value, serde_json::Value),
        token: &str,
        occupy_path: String,
    ) -> TestResult<Self> {
        let installed =
            Self::create(&client, name, subject, resource_rules, token, occupy_path).await;
        if installed.is_err() {
            // Whatever was made before the failure goes: it would refuse the identity's lists
            // for every later test on the cluster.
            delete_both(&client, name).await;
        }
        installed
    }

    async fn create(
        client: &kube::Client,
        name: &str,
        subject: serde_json::Value,
        resource_rules: serde_json::Value,
        token: &str,
        occupy_path: String,
    ) -> TestResult<Self> {
        Api::<PriorityLevelConfiguration>::all(client.clone())
            .create(
                &PostParams::default(),
                &serde_json::from_value(serde_json::json!({
                    "metadata": { "name": name },
                    "spec": { "type": "Limited", "limited": {
                        "nominalConcurrencyShares": 0,
                        "lendablePercent": 0,
                        "borrowingLimitPercent": 0,
                        "limitResponse": { "type": "Reject" },
                    }},
                }))?,
            )
            .await?;
        Api::<FlowSchema>::all(client.clone())
            .create(
                &PostParams::default(),
                &serde_json::from_value(serde_json::json!({
                    "metadata": { "name": name },
                    "spec": {
                        "priorityLevelConfiguration": { "name": name },
                        "matchingPrecedence": 2,
                        "distinguisherMethod": { "type": "ByUser" },
                        "rules": [{ "subjects": [subject], "resourceRules": resource_rules }],
                    },
                }))?,
            )
            .await?;
        let before = rejected(client, name).await;
        let stop = CancellationToken::new();
        let occupier = tokio::spawn(occupy(
            // Each answer is followed at once by the next request, never by a backoff.
            Cluster::shared().client_with_token(token, false).await?,
            occupy_path,
            stop.clone(),
        ));
        Ok(Self {
            client: client.clone(),
            name: name.to_owned(),
            occupier,
            stop,
            before,
        })
    }

    /// Waits (at most `within`) until the API server refuses a LIST of `path` by the identity
    /// of `token`: it applies a new flow schema a moment after it is written. Whether it did.
    pub async fn in_force(&self, token: &str, path: &str, within: std::time::Duration) -> bool {
        let Ok(client) = Cluster::shared().client_with_token(token, false).await else {
            return false;
        };
        let deadline = tokio::time::Instant::now() + within;
        while tokio::time::Instant::now() < deadline {
            let Ok(request) = tonic::codegen::http::Request::get(path).body(Vec::new()) else {
                return false;
            };
            if let Err(kube::Error::Api(status)) = client.request_text(request).await
                && status.code == 429
            {
                return true;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        false
    }

    /// How many requests the API server has refused at the level since it was installed: the
    /// identity's lists (the occupier's requests run one after the other).
    pub async fn refused(&self) -> u64 {
        rejected(&self.client, &self.name)
            .await
            .saturating_sub(self.before)
    }

    /// Lists go through again: the occupier stops and both objects are deleted (each tried
    /// whatever became of the other; the first failure is returned).
    pub async fn remove(self) -> TestResult {
        self.stop.cancel();
        let occupier = self.occupier.await;
        let dp = DeleteParams::default();
        let schema = Api::<FlowSchema>::all(self.client.clone())
            .delete(&self.name, &dp)
            .await;
        let level = Api::<PriorityLevelConfiguration>::all(self.client)
            .delete(&self.name, &dp)
            .await;
        occupier?;
        schema?;
        level?;
        Ok(())
    }
}

/// Deletes the flow schema and priority level `name`, whichever exist.
async fn delete_both(client: &kube::Client, name: &str) {
    let dp = DeleteParams::default();
    let _ = Api::<FlowSchema>::all(client.clone())
        .delete(name, &dp)
        .await;
    let _ = Api::<PriorityLevelConfiguration>::all(client.clone())
        .delete(name, &dp)
        .await;
}

/// The requests the API server has rejected under flow schema `name`, ever.
async fn rejected(client: &kube::Client, name: &str) -> u64 {
    let Ok(request) = tonic::codegen::http::Request::get("/metrics").body(Vec::new()) else {
        return 0;
    };
    let metrics = client.request_text(request).await.unwrap_or_default();
    let series = format!("apiserver_flowcontrol_rejected_requests_total{{flow_schema=\"{name}\"");
    metrics
        .lines()
        .filter(|l| l.starts_with(&series))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// Asks `path` again and again with `client` until `stop`, whatever the answers.
async fn occupy(client: kube::Client, path: String, stop: CancellationToken) {
    while !stop.is_cancelled() {
        let Ok(request) = tonic::codegen::http::Request::get(&path).body(Vec::new()) else {
            return;
        };
        tokio::select! {
            () = stop.cancelled() => return,
            _ = client.request_text(request) => {}
        }
    }
}
