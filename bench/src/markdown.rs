//! What a run writes: its section of its page in bench/results/ (the figures' tables under a header that
//! says how, where and with what they were produced) and its figures as JSON.

use std::{
    path::{Path, PathBuf},
    time::SystemTime,
};

use anyhow::Context as _;
use serde::Serialize;

/// Writes `figures` into `path` as JSON (creating its directory).
pub(crate) fn write_json(path: &Path, figures: &impl Serialize) -> anyhow::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let mut json =
        serde_json::to_string_pretty(figures).context("cannot encode the figures as JSON")?;
    json.push('\n');
    std::fs::write(path, json).with_context(|| format!("cannot write {}", path.display()))
}

pub(crate) fn command_output(program: &Path, args: &[&str]) -> String {
    std::process::Command::new(program)
        .args(args)
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.lines().next().map(str::to_owned))
        .unwrap_or_else(|| "unknown".to_owned())
}

/// The directory this benchmark's binary is in: where `cargo build` put the binaries it
/// starts, built with the same profile.
pub(crate) fn own_dir() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(Path::to_path_buf))
        .unwrap_or_else(|| PathBuf::from("target/dist"))
}

/// How the binaries in `dir` were built, from the name of cargo's profile directory.
pub(crate) fn build_profile(dir: &Path) -> String {
    match dir.file_name().and_then(|n| n.to_str()) {
        Some("dist") => {
            "`cargo build --profile dist` (release, fat link-time optimisation, one codegen unit)"
                .to_string()
        }
        Some("release") => "`cargo build --release`".to_string(),
        Some("debug") => "`cargo build` (unoptimised)".to_string(),
        Some(other) => format!("cargo's `{other}` profile"),
        None => "unknown".to_string(),
    }
}

pub(crate) fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines().find_map(|l| {
                l.strip_prefix("model name")
                    .map(|m| m.trim_start_matches([' ', '\t', ':']).to_owned())
            })
        })
        .unwrap_or_else(|| "unknown CPU".to_owned());
    let cores = std::thread::available_parallelism().map_or(0, usize::from);
    let memory = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            let kib: f64 = m.lines().next()?.split_whitespace().nth(1)?.parse().ok()?;
            Some(format!("{:.0} GiB", kib / 1024.0 / 1024.0))
        })
        .unwrap_or_default();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!(
        "{cpu}, {cores} cores available, {memory} memory, Linux {}",
        kernel.trim()
    )
}

pub(crate) fn crate_version(root: &Path, name: &str) -> String {
    let lock = std::fs::read_to_string(root.join("Cargo.lock")).unwrap_or_default();
    let header = format!("name = \"{name}\"\nversion = \"");
    lock.find(&header)
        .and_then(|at| {
            lock[at + header.len()..]
                .split('"')
                .next()
                .map(str::to_owned)
        })
        .unwrap_or_else(|| "unknown".to_owned())
}

/// Replaces what lies between the markers of `name` in `path` (creating the file if it does not
/// exist, appending the section if the file lacks it).
pub(crate) fn write_section(path: &Path, name: &str, section: &str) -> anyhow::Result<()> {
    let begin_marker = format!("<!-- bench:{name}:begin -->");
    let end_marker = format!("<!-- bench:{name}:end -->");
    let mut current = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
    };
    if !current.contains(&begin_marker) {
        current.push_str(&format!("\n{begin_marker}\n{end_marker}\n"));
    }
    let (Some(begin), Some(end)) = (current.find(&begin_marker), current.find(&end_marker)) else {
        anyhow::bail!("{} has {begin_marker} but not {end_marker}", path.display());
    };
    anyhow::ensure!(
        begin < end,
        "{}: the markers of {name} are out of order",
        path.display()
    );
    let updated = format!(
        "{}{begin_marker}\n{section}{}",
        &current[..begin],
        &current[end..]
    );
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    std::fs::write(path, updated).with_context(|| format!("cannot write {}", path.display()))
}

/// A section's text: `table` under a header that says which command produced it, when, with
/// `what` (the run's shape), on which machine, with the binaries of `bin_dir`.
pub(crate) fn produced(command: &str, what: &str, bin_dir: &Path, table: &str) -> String {
    format!(
        "Produced by `{command}` on {} ({what}).\n\n- Machine: {}\n- Binaries: {}\n\n{table}",
        humantime::format_rfc3339_seconds(SystemTime::now()),
        machine(),
        build_profile(bin_dir),
    )
}
