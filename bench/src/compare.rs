//! `compare`: every variant of the controller on every scenario (kinds, object counts,
//! controllers), repeated, with the plots and the section of results they make.

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    path::{Path, PathBuf},
    time::{Instant, SystemTime},
};

use anyhow::Context as _;
use kube_dispatch_bench::now_micros;

use crate::{
    Plane,
    cli::CompareArgs,
    harness::{
        objects::{self, Kind, install_crd, populate},
        plot,
        report::{self, Axis, Row, Scenario, rows, series},
        run::{RunResult, Setup},
    },
    markdown::{build_profile, command_output, crate_version, machine},
    objects_namespace,
};

/// `compare`: every variant on every scenario, written into the section --section.
pub(crate) async fn compare(args: CompareArgs) -> anyhow::Result<()> {
    args.check()?;
    let binaries = args.processes.binaries(
        args.controller_runtime.clone(),
        args.controller_runtime_dispatch.clone(),
    )?;
    let plane = Plane::connect().await?;
    let client = &plane.client;
    if args.kinds.contains(&Kind::Record) {
        install_crd(client).await?;
    }
    let nonce = now_micros();
    let namespaces = args.namespaces;

    let mut scenarios = Vec::new();
    for kinds in kind_sets(&args) {
        for &objects in &args.objects {
            let namespace = populate_scenario(client, &args, &kinds, objects).await?;
            for &groups in &args.groups {
                let setup = Setup {
                    client,
                    kubeconfig: plane.kubeconfig,
                    binaries: &binaries,
                    control_plane: plane.control_plane,
                    kinds: &kinds,
                    namespace: &namespace,
                    objects,
                    namespaces,
                    groups,
                    dispatchers: usize::from(args.dispatchers),
                    writes: args.writes,
                    write_interval: args.write_interval,
                    log_dir: &args.processes.logs,
                    ring_key: args.ring_key.as_deref(),
                    nonce,
                    children: args.children,
                    profile_apiserver: args.profile_apiserver,
                };
                let runs = repeat_runs(&setup, &args).await?;
                let scenario = Scenario {
                    kinds: kinds.clone(),
                    objects,
                    namespaces,
                    groups,
                    children: args.children,
                    runs,
                };
                println!("\n{}", scenario.table());
                scenarios.push(scenario);
            }
        }
    }

    let plots = draw_plots(&args, &scenarios);
    let section = results_section(&args, plane.root, &scenarios, &plots)?;
    args.output
        .write(&args.section, &section, &report::Figures::of(&scenarios))
}

/// Writes one scenario's objects (`objects` of each of `kinds`, with their children): returns
/// the namespace of the tier's Leases, and of the objects when they are in one.
async fn populate_scenario(
    client: &kube::Client,
    args: &CompareArgs,
    kinds: &[Kind],
    objects: usize,
) -> anyhow::Result<String> {
    let namespaces = args.namespaces;
    let begun = Instant::now();
    // In one namespace, every kind's objects share it; spread over many, the tier's
    // Leases go beside the first kind's.
    let mut namespace = if args.children > 0 && namespaces == 1 {
        objects::owners_namespace(&objects::flags(kinds), objects, args.children)
    } else if namespaces == 1 {
        objects_namespace(&objects::flags(kinds), objects, args.object_bytes)
    } else {
        String::new()
    };
    let mut written = 0;
    for &kind in kinds {
        if namespaces == 1 {
            written += populate(client, kind, &namespace, objects, args.object_bytes).await?;
        } else {
            let spread = objects::Spread::new(objects, namespaces, args.children);
            let (leases, n) =
                objects::populate_spread(client, kind, spread, args.object_bytes).await?;
            if namespace.is_empty() {
                namespace = leases;
            }
            written += n;
        }
    }
    if args.children > 0 && namespaces == 1 {
        written += objects::populate_children(client, &namespace, objects, args.children).await?;
    } else if args.children > 0 {
        let spread = objects::Spread::new(objects, namespaces, args.children);
        for i in 0..namespaces {
            written +=
                objects::populate_children(client, &spread.namespace(i), spread.per, args.children)
                    .await?;
        }
    }
    println!(
        "bench: {objects} {} in {}: {written} written in {:.1} s",
        objects::titles(kinds),
        if namespaces == 1 {
            namespace.clone()
        } else {
            format!("{namespaces} namespaces")
        },
        begun.elapsed().as_secs_f64()
    );
    Ok(namespace)
}

/// Every variant of `args` on `setup`, `--repeats` times, each repeat starting one variant
/// later in the order.
async fn repeat_runs(setup: &Setup<'_>, args: &CompareArgs) -> anyhow::Result<Vec<RunResult>> {
    let namespace = setup.namespace;
    let mut runs = Vec::new();
    for repeat in 0..args.repeats {
        let mut order = args.variants.clone();
        let turn = repeat % order.len();
        order.rotate_left(turn);
        for variant in order {
            let result = setup
                .run(variant, repeat)
                .await
                .with_context(|| format!("{namespace}: {variant}, run {}", repeat + 1))?;
            println!(
                "bench: {namespace} {variant:<17} run {}: first reconcile {:>7.0} ms, all {:>7.0} ms, replica peak {:>6.1} MiB",
                repeat + 1,
                result.first_reconcile.as_secs_f64() * 1e3,
                result.all_reconciled.as_secs_f64() * 1e3,
                result
                    .replicas
                    .iter()
                    .map(|u| u.peak_rss)
                    .max()
                    .unwrap_or(0) as f64
                    / 1024.0
                    / 1024.0,
            );
            runs.push(result);
        }
    }
    Ok(runs)
}

/// The kinds of each scenario: all of --kinds together with --mix, else each on its own.
fn kind_sets(args: &CompareArgs) -> Vec<Vec<Kind>> {
    if args.mix {
        vec![args.kinds.clone()]
    } else {
        args.kinds.iter().map(|k| vec![*k]).collect()
    }
}

/// Memory and start-up against object count, per scenario's kinds; the paths drawn.
fn draw_plots(args: &CompareArgs, scenarios: &[Scenario]) -> Vec<(String, PathBuf)> {
    if let Err(e) = plot::register_font(args.font.as_deref()) {
        eprintln!("bench: no plots: {e:#}");
        return Vec::new();
    }
    if let Err(e) = std::fs::create_dir_all(&args.plots_dir) {
        eprintln!(
            "bench: no plots: cannot create {}: {e}",
            args.plots_dir.display()
        );
        return Vec::new();
    }
    let mut plots = Plots {
        args,
        scenarios,
        rows: rows(),
        suffix: if args.section == "default" {
            String::new()
        } else {
            format!("-{}", args.section)
        },
        drawn: Vec::new(),
    };
    for kinds in kind_sets(args) {
        // Against the object count; with many controllers, only when there are several counts
        // (the plots against the number of controllers show the rest).
        if args.groups.len() == 1 || args.objects.len() > 1 {
            plots.by_objects(&kinds);
        }
        if args.groups.len() > 1 {
            plots.by_groups(&kinds);
        }
    }
    plots.drawn
}

/// The plots of one `compare`, and those drawn so far.
struct Plots<'a> {
    args: &'a CompareArgs,
    scenarios: &'a [Scenario],
    rows: Vec<Row>,
    /// After each file's name: the section's, but for the default section.
    suffix: String,
    drawn: Vec<(String, PathBuf)>,
}

impl Plots<'_> {
    /// The figure of the row whose label starts with `label`, against `axis`, per variant
    /// named with `suffix` after it.
    fn series(
        &self,
        kinds: &[Kind],
        axis: Axis,
        label: &str,
        suffix: &str,
    ) -> BTreeMap<String, Vec<(usize, f64)>> {
        let Some(row) = self.rows.iter().find(|r| r.label.starts_with(label)) else {
            return BTreeMap::new();
        };
        series(self.scenarios, kinds, axis, row)
            .into_iter()
            .map(|(v, p)| (format!("{v}{suffix}"), p))
            .collect()
    }

    /// Draws `data` into `file` in the plots' directory. Nothing to draw (one count of objects
    /// with several controllers, say): no file, and so no link to one.
    fn draw(
        &mut self,
        file: String,
        title: String,
        x: &str,
        y: &str,
        data: BTreeMap<String, Vec<(usize, f64)>>,
    ) {
        let path = self.args.plots_dir.join(file);
        match plot::draw(&path, &title, x, y, &data) {
            Ok(true) => self.drawn.push((title, path)),
            Ok(false) => {}
            Err(e) => eprintln!("bench: cannot draw {}: {e:#}", path.display()),
        }
    }

    /// Peak memory and start-up times against the object count.
    fn by_objects(&mut self, kinds: &[Kind]) {
        let axis = Axis::Objects;
        let mut memory = self.series(kinds, axis, "controller RSS, peak", " replica");
        memory.extend(self.series(kinds, axis, "dispatcher RSS, peak", " dispatcher (each)"));
        let mut startup = self.series(kinds, axis, "start to first reconcile", ": first reconcile");
        startup.extend(self.series(kinds, axis, "start to all objects", ": all reconciled"));
        for (what, title, y, data) in [
            ("memory", "peak RSS per process", "MiB", memory),
            ("startup", "process start to reconciles", "ms", startup),
        ] {
            self.draw(
                format!("{what}-{}{}.png", objects::flags(kinds), self.suffix),
                format!("{}: {title}", objects::titles(kinds)),
                "objects",
                y,
                data,
            );
        }
    }

    /// Many controllers: what the whole cluster pays, against the number of controllers.
    fn by_groups(&mut self, kinds: &[Kind]) {
        for &objects in &self.args.objects {
            let axis = Axis::Groups(objects);
            for (what, label, title, y) in [
                (
                    "total-memory",
                    "all processes RSS",
                    "RSS of every process",
                    "MiB",
                ),
                (
                    "apiserver-cpu",
                    "CPU, kube-apiserver",
                    "kube-apiserver CPU",
                    "s",
                ),
                (
                    "all-reconciled",
                    "start to all objects",
                    "start to every object reconciled by every controller",
                    "ms",
                ),
            ] {
                if !self.rows.iter().any(|r| r.label.starts_with(label)) {
                    continue;
                }
                let data = self.series(kinds, axis, label, "");
                self.draw(
                    format!(
                        "{what}-{}-{objects}{}.png",
                        objects::flags(kinds),
                        self.suffix
                    ),
                    format!("{}, {objects} objects: {title}", objects::titles(kinds)),
                    "controllers",
                    y,
                    data,
                );
            }
        }
    }
}

/// The Markdown written between the markers of --out.
fn results_section(
    args: &CompareArgs,
    root: &Path,
    scenarios: &[Scenario],
    plots: &[(String, PathBuf)],
) -> anyhow::Result<String> {
    let bin_dir = std::process::Command::new(root.join("tests/cluster/build-binaries.sh"))
        .arg("--print-dir")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| PathBuf::from(s.trim()))
        .unwrap_or_default();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Produced by `{}` on {} (runs of each variant: {}; timed writes per run: {}, {} apart; data per object: {} bytes; dispatchers: {}, ring keyed by {}{}{}).\n",
        args.output.command("make bench"),
        humantime::format_rfc3339_seconds(SystemTime::now()),
        args.repeats,
        args.writes,
        humantime::format_duration(args.write_interval),
        args.object_bytes,
        args.dispatchers,
        args.ring_key.as_deref().unwrap_or("name"),
        if args.namespaces == 1 {
            String::new()
        } else {
            format!(
                "; objects spread over {} namespaces, every controller over all namespaces with a label selector{}",
                args.namespaces,
                if args.children > 0 {
                    " (the children carry their owner's label)"
                } else {
                    ""
                }
            )
        },
        if args.mix {
            format!(
                "; a mix of resources: controller g reconciles every object of the (g mod {})th of {}, the timed writes go to them in turn, and the API requests are summed over their resources",
                args.kinds.len(),
                objects::titles(&args.kinds)
            )
        } else {
            String::new()
        },
    );
    let _ = writeln!(out, "- Machine: {}", machine());
    let _ = writeln!(
        out,
        "- Versions: {}; kube-apiserver {}; etcd {}; kube (kube-rs) {}; tonic {}",
        command_output(Path::new("rustc"), &["--version"]),
        command_output(&bin_dir.join("kube-apiserver"), &["--version"])
            .trim_start_matches("Kubernetes "),
        command_output(&bin_dir.join("etcd"), &["--version"]).trim_start_matches("etcd Version: "),
        crate_version(root, "kube"),
        crate_version(root, "tonic"),
    );
    let _ = writeln!(
        out,
        "- Binaries: {}\n",
        build_profile(&args.processes.bin_dir())
    );
    for s in scenarios {
        let _ = writeln!(out, "{}", s.table());
    }
    if let Some(path) = &args.core_results {
        let core = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        let lines: Vec<&str> = core
            .lines()
            .filter(|l| l.starts_with("dispatch core") || l.starts_with("  "))
            .collect();
        let _ = writeln!(
            out,
            "#### Dispatch core, synthetic events (`make bench-core`)\n\n```\n{}\n```\n",
            lines.join("\n")
        );
    }
    let out_dir = args.output.pages_dir();
    for (title, path) in plots {
        let relative = path.strip_prefix(out_dir).unwrap_or(path);
        let _ = writeln!(out, "![{title}]({})\n", relative.display());
    }
    Ok(out)
}
