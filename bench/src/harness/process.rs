//! The processes a run starts, and what the kernel says they used (Linux `/proc`).

use std::{
    path::{Path, PathBuf},
    process::Stdio,
    sync::OnceLock,
};

use anyhow::Context as _;
use kube_dispatch_bench::ReconcileStart;
use tokio::{
    io::{AsyncBufReadExt, BufReader},
    process::{Child, Command},
    sync::{mpsc, watch},
};

/// Memory and CPU of one process, read just before it is stopped.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Usage {
    /// Peak resident set (VmHWM), bytes.
    pub(crate) peak_rss: u64,
    /// Resident set at the time of reading (VmRSS), bytes.
    pub(crate) rss: u64,
    /// User plus system CPU time since the process started, seconds.
    pub(crate) cpu_seconds: f64,
}

/// Clock ticks per second of `/proc/<pid>/stat` times (`getconf CLK_TCK`, 100 on Linux), asked
/// once.
fn clock_ticks() -> f64 {
    static TICKS: OnceLock<f64> = OnceLock::new();
    *TICKS.get_or_init(|| {
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(100.0)
    })
}

/// CPU seconds (user + system) of a live process.
pub(crate) fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses: fields are counted after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // Field 3 of proc(5) is fields[0]; utime and stime are fields 14 and 15.
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / clock_ticks())
}

/// Peak and current RSS and CPU time of a live process.
pub(crate) fn usage(pid: u32) -> Option<Usage> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib = |field: &str| -> Option<u64> {
        let line = status.lines().find(|l| l.starts_with(field))?;
        line[field.len()..]
            .split_whitespace()
            .next()?
            .parse::<u64>()
            .ok()
            .map(|k| k * 1024)
    };
    Some(Usage {
        peak_rss: kib("VmHWM:")?,
        rss: kib("VmRSS:")?,
        cpu_seconds: cpu_seconds(pid)?,
    })
}

/// One started process: a dispatcher, the load balancer or a controller replica.
pub(crate) struct Component {
    pub(crate) name: String,
    child: Child,
    pid: u32,
    pub(crate) log: PathBuf,
    /// Whether it has printed [`READY`] (only followed with `reconciles`).
    ready: watch::Receiver<bool>,
}

/// The line a controller prints on stdout once it would pass a readiness probe.
const READY: &str = "ready";

impl Component {
    /// Starts `program` with `args` and `env` added to the harness's environment. Its stderr
    /// (and its stdout, unless `reconciles` is given) goes to `<log_dir>/<name>.log`. With
    /// `reconciles`, every [`ReconcileStart`] line on its stdout is sent there, and a [`READY`]
    /// line marks it ready ([`Component::ready`]).
    pub(crate) fn spawn(
        name: &str,
        program: &Path,
        args: &[String],
        env: &[(&str, String)],
        log_dir: &Path,
        reconciles: Option<mpsc::Sender<ReconcileStart>>,
    ) -> anyhow::Result<Self> {
        let log = log_dir.join(format!("{name}.log"));
        let file = std::fs::File::create(&log)
            .with_context(|| format!("cannot create {}", log.display()))?;
        let mut command = Command::new(program);
        command
            .args(args)
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .stdin(Stdio::null())
            .stderr(file.try_clone()?)
            .kill_on_drop(true);
        if reconciles.is_some() {
            command.stdout(Stdio::piped());
        } else {
            command.stdout(file);
        }
        let mut child = command
            .spawn()
            .with_context(|| format!("cannot start {}", program.display()))?;
        let pid = child
            .id()
            .with_context(|| format!("{name} exited at once"))?;
        let (ready_tx, ready) = watch::channel(false);
        if let (Some(tx), Some(stdout)) = (reconciles, child.stdout.take()) {
            tokio::spawn(async move {
                let mut lines = BufReader::new(stdout).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    if line == READY {
                        ready_tx.send_replace(true);
                    } else if let Ok(start) = line.parse::<ReconcileStart>()
                        && tx.send(start).await.is_err()
                    {
                        break;
                    }
                }
            });
        }
        Ok(Self {
            name: name.to_owned(),
            child,
            pid,
            log,
            ready,
        })
    }

    /// Waits until the process says it is ready; fails if it exits first or takes longer
    /// than `bound`.
    pub(crate) async fn ready(&mut self, bound: std::time::Duration) -> anyhow::Result<()> {
        let mut ready = self.ready.clone();
        let waited = tokio::select! {
            waited = tokio::time::timeout(bound, ready.wait_for(|r| *r)) => waited,
            error = self.exited() => return Err(error),
        };
        match waited {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(_)) => anyhow::bail!(
                "{} closed its stdout before it was ready; see {}",
                self.name,
                self.log.display()
            ),
            Err(_) => anyhow::bail!(
                "{} was not ready within {bound:?}; see {}",
                self.name,
                self.log.display()
            ),
        }
    }

    /// SIGTERM, as the kubelet stops a pod, and waits until it has exited, at most `grace`
    /// (then SIGKILL, as the kubelet does after the grace period): whether it exited in time.
    pub(crate) async fn terminate(mut self, grace: std::time::Duration) -> bool {
        let pid = rustix::process::Pid::from_raw(i32::try_from(self.pid).unwrap_or(i32::MAX));
        if let Some(pid) = pid
            && let Err(e) = rustix::process::kill_process(pid, rustix::process::Signal::TERM)
        {
            tracing::warn!(component = %self.name, error = %e, "cannot send SIGTERM");
        }
        match tokio::time::timeout(grace, self.child.wait()).await {
            Ok(_) => true,
            Err(_) => {
                tracing::warn!(component = %self.name, ?grace, "did not stop within its grace: killed");
                self.kill().await;
                false
            }
        }
    }

    /// Fails if the process has exited: none of them should before it is killed.
    pub(crate) fn ensure_running(&mut self) -> anyhow::Result<()> {
        if let Ok(Some(status)) = self.child.try_wait() {
            anyhow::bail!(
                "{} exited early ({status}); see {}",
                self.name,
                self.log.display()
            );
        }
        Ok(())
    }

    /// Waits until the process exits, which none should before it is killed, and says so.
    pub(crate) async fn exited(&mut self) -> anyhow::Error {
        match self.child.wait().await {
            Ok(status) => anyhow::anyhow!(
                "{} exited early ({status}); see {}",
                self.name,
                self.log.display()
            ),
            Err(e) => anyhow::anyhow!("cannot wait for {}: {e}", self.name),
        }
    }

    /// Usage so far; fails if the process has exited.
    pub(crate) fn usage(&mut self) -> anyhow::Result<Usage> {
        self.ensure_running()?;
        usage(self.pid).with_context(|| format!("cannot read /proc/{} of {}", self.pid, self.name))
    }

    /// SIGKILL, and wait until it has exited.
    pub(crate) async fn kill(mut self) {
        if let Err(e) = self.child.kill().await {
            tracing::warn!(component = %self.name, error = %e, "cannot kill");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_process_that_exits_is_reported_with_its_log() {
        let dir = std::env::temp_dir().join(format!("kd-bench-exited-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut component =
            Component::spawn("quitter", Path::new("false"), &[], &[], &dir, None).unwrap();
        let error = component.exited().await.to_string();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(
            error.starts_with("quitter exited early (exit status: 1)"),
            "{error}"
        );
        assert!(error.contains("quitter.log"), "{error}");
    }
}
