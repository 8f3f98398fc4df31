//! A real Prometheus on loopback for tests of the alert rules: the distribution's binary
//! (`tests/cluster/prometheus.sh` installs it once), scraping given admin endpoints every second
//! and evaluating given rules every second, its alerts read back through its HTTP API.

use std::{
    net::SocketAddr,
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::Duration,
};

use serde_json::Value;

use crate::{TestResult, eventually, http::get, repo_root, run_script_file};

/// A running Prometheus; killed, and its data removed, when dropped.
#[derive(Debug)]
pub struct Prometheus {
    /// Its HTTP API.
    pub addr: SocketAddr,
    dir: PathBuf,
    process: Child,
}

/// An alert as Prometheus's API shows it.
#[derive(Clone, Debug, PartialEq)]
pub struct Alert {
    /// Its labels (alertname among them).
    pub labels: Value,
    /// `pending` or `firing`.
    pub state: String,
    /// When its expression first held, as Prometheus says it (RFC 3339).
    pub active_at: String,
}

impl Prometheus {
    /// Starts Prometheus with its configuration and data in `dir` (made afresh; a test's folder
    /// of cargo's scratch space), scraping `targets` and evaluating `rules` (a rules file's
    /// text), and waits until it is ready.
    pub async fn start(dir: PathBuf, targets: &[SocketAddr], rules: &str) -> TestResult<Self> {
        let bin = match std::env::var("KD_PROMETHEUS_DIR") {
            Ok(dir) if !dir.is_empty() => PathBuf::from(dir),
            _ => PathBuf::from(run_script_file(&repo_root(), "prometheus.sh", &[])?.trim()),
        };
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join("rules.yaml"), rules)?;
        let targets: Vec<String> = targets.iter().map(|t| format!("\"{t}\"")).collect();
        std::fs::write(
            dir.join("prometheus.yml"),
            format!(
                "global: {{scrape_interval: 1s, scrape_timeout: 1s, evaluation_interval: 1s}}\n\
                 rule_files: [rules.yaml]\n\
                 scrape_configs:\n  - job_name: tier\n    static_configs:\n      - targets: [{}]\n",
                targets.join(", ")
            ),
        )?;
        let addr = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
        let process = Command::new(bin.join("prometheus"))
            .arg(format!(
                "--config.file={}",
                dir.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("prometheus.log"))?)
            .spawn()?;
        let prometheus = Self { addr, dir, process };
        eventually(Duration::from_secs(30), "Prometheus ready", || async {
            (get(prometheus.addr, "/-/ready").await.ok()?.0 == 200).then_some(())
        })
        .await?;
        Ok(prometheus)
    }

    /// The alerts named `name`, pending or firing, as the API shows them now.
    pub async fn alerts(&self, name: &str) -> TestResult<Vec<Alert>> {
        let (status, body) = get(self.addr, "/api/v1/alerts").await?;
        let answer: Value = serde_json::from_str(&body)
            .map_err(|e| format!("Prometheus answered {status} and not JSON: {e}"))?;
        Ok(answer["data"]["alerts"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|a| a["labels"]["alertname"] == name)
            .map(|a| Alert {
                labels: a["labels"].clone(),
                state: a["state"].as_str().unwrap_or_default().to_owned(),
                active_at: a["activeAt"].as_str().unwrap_or_default().to_owned(),
            })
            .collect())
    }

    /// The value of the instant query `query` now, if it has one sample.
    pub async fn query(&self, query: &str) -> TestResult<Option<f64>> {
        let encoded = form_urlencoded::Serializer::new(String::new())
            .append_pair("query", query)
            .finish();
        let (_, body) = get(self.addr, &format!("/api/v1/query?{encoded}")).await?;
        let answer: Value = serde_json::from_str(&body).unwrap_or_default();
        Ok(answer["data"]["result"][0]["value"][1]
            .as_str()
            .and_then(|v| v.parse().ok()))
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
