//! A shape's processes as its events change them: replicas replaced, dispatchers restarted.

use anyhow::Context as _;

use super::{BOUND, Event, GRACE, REPLICAS, Running};
use crate::harness::{
    process::Component,
    run::{
        Setup, Tier,
        processes::{dispatchers_ready, until_ready},
    },
};

/// What a dispatcher logs as it judges a member dead.
const JUDGED_DEAD: &str = "dispatcher judged dead";

impl Running {
    /// Starts the next replica.
    pub(super) fn spawn_replica(&mut self, setup: &Setup<'_>) -> anyhow::Result<Component> {
        let replica = setup.spawn_replica(
            (0, self.started),
            (&self.program, &self.args),
            self.lb_port,
            &self.log_dir,
            &self.group_tx,
        )?;
        self.started += 1;
        Ok(replica)
    }

    /// Resident bytes of every process now.
    pub(super) fn rss(&mut self) -> anyhow::Result<u64> {
        let tier = self
            .tier
            .as_mut()
            .map_or(&mut [][..], |t| &mut t.components[..]);
        let mut bytes = 0;
        for c in self
            .replicas
            .iter_mut()
            .chain(tier)
            .chain(&mut self.standby_lb)
        {
            bytes += c.usage()?.rss;
        }
        Ok(bytes)
    }

    /// The judgements that a member died the dispatchers of this run have logged since the
    /// last call (each process's log, restarts included).
    pub(super) fn judged_dead_since_last(&mut self) -> anyhow::Result<u64> {
        let judged = self.judged_dead()?;
        let since = judged.saturating_sub(self.judged_counted);
        self.judged_counted = judged;
        Ok(since)
    }

    /// The judgements that a member died the dispatchers of this run have logged so far.
    fn judged_dead(&self) -> anyhow::Result<u64> {
        let mut judged = 0;
        for entry in std::fs::read_dir(&self.log_dir)? {
            let path = entry?.path();
            let name = path
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default();
            if name.starts_with("dispatcher-") {
                let log = std::fs::read_to_string(&path)
                    .with_context(|| format!("cannot read {}", path.display()))?;
                judged += log.matches(JUDGED_DEAD).count() as u64;
            }
        }
        Ok(judged)
    }

    /// What `event` does to the processes.
    pub(super) async fn act(&mut self, setup: &Setup<'_>, event: Event) -> anyhow::Result<()> {
        match event {
            // As long as the writer takes to write each of its objects once.
            Event::Steady => {
                let writes = u32::try_from(setup.writes).unwrap_or(u32::MAX);
                tokio::time::sleep(setup.write_interval * writes).await;
            }
            Event::Rollout => {
                for _ in 0..REPLICAS {
                    let mut new = self.spawn_replica(setup)?;
                    new.ready(BOUND).await?;
                    let old = self.replicas.remove(0);
                    let name = old.name.clone();
                    self.replicas.push(new);
                    anyhow::ensure!(
                        old.terminate(GRACE).await,
                        "{name} did not stop within {GRACE:?} of SIGTERM and was killed"
                    );
                }
            }
            Event::TierUpgrade => {
                let tier = self.tier.as_mut().context("a tier upgrade needs a tier")?;
                for i in (0..tier.components.len().min(tier.dispatcher_env.len())).rev() {
                    let old = tier.components.remove(i);
                    let name = old.name.clone();
                    anyhow::ensure!(
                        old.terminate(GRACE).await,
                        "{name} did not stop within {GRACE:?} of SIGTERM and was killed"
                    );
                    self.restarts += 1;
                    let new = Component::spawn(
                        &format!("dispatcher-{i}-restart-{}", self.restarts),
                        &setup.binaries.dispatcher,
                        &[],
                        &tier.dispatcher_env[i],
                        &self.log_dir,
                        None,
                    )?;
                    tier.components.insert(i, new);
                    serving(tier).await?;
                }
            }
        }
        Ok(())
    }
}

/// Waits until every dispatcher of `tier` serves on a ring of them all.
async fn serving(tier: &mut Tier) -> anyhow::Result<()> {
    let admins = &tier.dispatcher_admin;
    until_ready(&mut tier.components, BOUND, async || {
        dispatchers_ready(admins).await
    })
    .await
    .context("waiting for the dispatchers to serve again after a restart")
}
