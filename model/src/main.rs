//! `make model`: the deep check of the protocol model (`src/lib.rs`). Prints the configuration,
//! the states explored and every property's verdict; exits non-zero on a violation, with the
//! path that leads to it.

use std::time::{Duration, Instant};

use clap::Parser;
use kube_dispatch_model::{
    Budget, Closes, Config, Deletions, Protocol, Takeover, Timing, Variant, Views,
    replay::{Replay, Script, faults_of_report},
};
use stateright::{Checker, Model};

/// Checks kube-dispatch's delivery protocol exhaustively within the given bounds.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// Dispatchers (1 to 3).
    #[arg(long, default_value_t = 3)]
    dispatchers: usize,
    /// Controller replicas (1 to 3); replica r belongs to group r % groups.
    #[arg(long, default_value_t = 2)]
    replicas: usize,
    /// Controller groups subscribed to the same keys (1 or 2), each with a queue of its own at
    /// every dispatcher; at most the replicas.
    #[arg(long, default_value_t = 1)]
    groups: usize,
    /// Make each group at a dispatcher only at the first session one of its replicas opens
    /// there since the dispatcher started (as the dispatcher does), rather than at every
    /// dispatcher from the start.
    #[arg(long)]
    lazy_groups: bool,
    /// Keys (1 or 2).
    #[arg(long, default_value_t = 2)]
    keys: usize,
    /// Ticks per session ttl: 4 (coarse) or 8 (fine, leaves room for drift).
    #[arg(long, default_value_t = 8)]
    resolution: u8,
    /// Dispatcher crashes a run may have.
    #[arg(long, default_value_t = 1)]
    dispatcher_crashes: u8,
    /// Graceful dispatcher stops (nothing in flight, Lease deleted) a run may have.
    #[arg(long, default_value_t = 1)]
    graceful_stops: u8,
    /// Replica crashes a run may have.
    #[arg(long, default_value_t = 1)]
    replica_crashes: u8,
    /// Cuts between a dispatcher and the API server.
    #[arg(long, default_value_t = 1)]
    api_cuts: u8,
    /// Lease renewals whose answer is lost.
    #[arg(long, default_value_t = 1)]
    lost_renewal_answers: u8,
    /// Lost messages between replicas and dispatchers.
    #[arg(long, default_value_t = 1)]
    lost_messages: u8,
    /// Object changes.
    #[arg(long, default_value_t = 2)]
    changes: u8,
    /// Ticks a replica's clock may fall behind.
    #[arg(long, default_value_t = 1)]
    drift: u8,
    /// Lease deletions without the drained mark (by hand, a cleanup job).
    #[arg(long, default_value_t = 1)]
    lease_deletions: u8,
    /// CloseSession calls sent while the session's reconciles still run (a client breaking
    /// the contract).
    #[arg(long, default_value_t = 1)]
    early_closes: u8,
    /// Object deletions (a change of a deleted object creates it again).
    #[arg(long, default_value_t = 1)]
    deletions: u8,
    /// Changes of owned objects (their owner's key must be reconciled).
    #[arg(long, default_value_t = 1)]
    owned_changes: u8,
    /// Reports by replicas that their session on a dispatcher ended, through which the others
    /// take over the keys of a dispatcher that died before the bound.
    #[arg(long, default_value_t = 1)]
    reports: u8,
    /// How the keys of a dispatcher that died are taken over: "reports" (the dispatcher as it
    /// is: once every session its Lease listed is reported ended, else after the bound),
    /// "bound" (always after the bound), or a broken rule the check must catch: "unlisted"
    /// (keys handed to a session before a Lease write lists it), "report-first" (a session
    /// reported ended before its reconciles have).
    #[arg(long, default_value = "reports", value_parser = ["reports", "bound", "unlisted", "report-first"])]
    takeover: String,
    /// Skip the liveness property (a fair run from every state with a change pending), which
    /// costs most of the time.
    #[arg(long)]
    no_liveness: bool,
    /// Check the SDK's old fencing (deadlines from the answer's arrival) instead.
    #[arg(long)]
    arrival_time: bool,
    /// Check the dispatcher's old membership (judged on every Lease event, including each one
    /// of a first list) instead.
    #[arg(long)]
    partial_lease_views: bool,
    /// Check the old reading of a deleted Lease (always a release) instead.
    #[arg(long)]
    deleted_lease_released: bool,
    /// Check dispatchers that release their ring while they wait out a member that died.
    #[arg(long)]
    release_while_waiting: bool,
    /// Check the old CloseSession (keys in flight go back to the queue at once) instead.
    #[arg(long)]
    close_releases: bool,
    /// Check the old dispatcher, which listed only after a handover, instead: keys that come
    /// back to a dispatcher without one (a member left the ring before its handover completed)
    /// are not listed, and a change made meanwhile is never delivered.
    #[arg(long)]
    returning_unlisted: bool,
    /// The group lists the owners itself: a change of an owned object queues a served key only
    /// once the dispatcher knows its object (`GroupEvent::OwnedChanged`'s `owners_listed`).
    #[arg(long)]
    owners_listed: bool,
    /// A restarted dispatcher renews its Lease as a member at once, instead of warming up first
    /// (its Lease marked warming, no member, until a step ends the warm-up) as the dispatcher
    /// does.
    #[arg(long)]
    no_warm_up: bool,
    /// Stop after this many states (0: explore everything within the bounds).
    #[arg(long, default_value_t = 0)]
    max_states: usize,
    /// Stop after this long, in seconds (0: no limit).
    #[arg(long, default_value_t = 0)]
    timeout: u64,
    /// Explore depth first (finds deep paths sooner; the default is breadth first, which
    /// finds the shortest path to a violation).
    #[arg(long)]
    dfs: bool,
    /// Explore no deeper than this many steps (0: no limit).
    #[arg(long, default_value_t = 0)]
    max_depth: usize,
    /// Checker threads.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Replay a chaos run instead (`make model-replay REPORT=file`): read its report (as
    /// `make chaos` or `make chaos-soak` prints it for a failing seed; `-` for stdin), take the
    /// faults around its first violation (else all of them, in order) as the only faults, in
    /// that order, and look for a violation among every interleaving of the model's own steps
    /// with them. The fault budget flags are then ignored.
    #[arg(long, value_name = "REPORT")]
    replay: Option<std::path::PathBuf>,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let timing = match args.resolution {
        4 => Timing::COARSE,
        8 => Timing::FINE,
        other => anyhow::bail!("--resolution must be 4 or 8, not {other}"),
    };
    anyhow::ensure!(
        (1..=3).contains(&args.dispatchers),
        "--dispatchers must be 1, 2 or 3"
    );
    anyhow::ensure!(
        (1..=3).contains(&args.replicas),
        "--replicas must be 1, 2 or 3"
    );
    anyhow::ensure!(
        (1..=2).contains(&args.groups) && args.groups <= args.replicas,
        "--groups must be 1 or 2, and at most --replicas"
    );
    anyhow::ensure!((1..=2).contains(&args.keys), "--keys must be 1 or 2");
    let config = Config {
        dispatchers: args.dispatchers,
        replicas: args.replicas,
        groups: args.groups,
        lazy_groups: args.lazy_groups,
        keys: args.keys,
        timing,
        budget: Budget {
            dispatcher_crashes: args.dispatcher_crashes,
            graceful_stops: args.graceful_stops,
            replica_crashes: args.replica_crashes,
            api_cuts: args.api_cuts,
            lost_renewal_answers: args.lost_renewal_answers,
            lost_messages: args.lost_messages,
            changes: args.changes,
            drift: args.drift,
            lease_deletions: args.lease_deletions,
            closes: args.early_closes,
            deletions: args.deletions,
            owned_changes: args.owned_changes,
            reports: args.reports,
        },
        liveness: !args.no_liveness,
        variant: if args.arrival_time {
            Variant::ArrivalTime
        } else {
            Variant::SendTime
        },
        views: if args.partial_lease_views {
            Views::Partial
        } else {
            Views::Whole
        },
        deletions: if args.deleted_lease_released {
            Deletions::Released
        } else {
            Deletions::Died
        },
        withhold: !args.release_while_waiting,
        closes: if args.close_releases {
            Closes::Release
        } else {
            Closes::Hold
        },
        relist_returning: !args.returning_unlisted,
        owners_listed: args.owners_listed,
        warm_up: !args.no_warm_up,
        takeover: match args.takeover.as_str() {
            "bound" => Takeover::Bound,
            "unlisted" => Takeover::Unlisted,
            "report-first" => Takeover::ReportFirst,
            _ => Takeover::Reports,
        },
        enabled_only: false,
    };
    if let Some(report) = &args.replay {
        return replay(&args, config, report);
    }
    println!("model: {config}");
    let verdict = explore(Protocol::new(config), &args);
    anyhow::ensure!(!verdict.failed(), "the model check failed");
    Ok(())
}

/// Explores `model` within the bounds of `args` and prints what it found.
fn explore<M>(model: M, args: &Args) -> Verdict
where
    M: Model + Send + Sync + 'static,
    M::State: std::fmt::Debug + Clone + PartialEq + std::hash::Hash + Send + Sync,
    M::Action: std::fmt::Debug + Clone + PartialEq + Send + Sync,
{
    let started = Instant::now();
    let mut builder = model.checker().threads(args.threads);
    if args.max_states > 0 {
        builder = builder.target_state_count(args.max_states);
    }
    if args.timeout > 0 {
        builder = builder.timeout(Duration::from_secs(args.timeout));
    }
    if args.max_depth > 0 {
        builder = builder.target_max_depth(args.max_depth);
    }
    let limits = Limits {
        max_states: args.max_states,
        max_depth: args.max_depth,
        timeout: args.timeout,
        started,
    };
    if args.dfs {
        report(builder.spawn_dfs().join(), limits)
    } else {
        report(builder.spawn_bfs().join(), limits)
    }
}

/// `--replay`: the faults of a chaos report through the model.
fn replay(args: &Args, mut config: Config, path: &std::path::Path) -> anyhow::Result<()> {
    let text = if path.as_os_str() == "-" {
        std::io::read_to_string(std::io::stdin())?
    } else {
        std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("cannot read the chaos report {}: {e}", path.display()))?
    };
    let faults = faults_of_report(&text);
    anyhow::ensure!(
        !faults.is_empty(),
        "{} names no fault: give a chaos report as `make chaos` or `make chaos-soak` prints it (a violation with its \"faults around\", or the \"faults (N)\" list)",
        path.display()
    );
    anyhow::ensure!(
        config.keys == 2,
        "a replay needs --keys 2: the faults are placed on the owner of one key and not of the other"
    );
    let script = Script::new(&faults, config.dispatchers, config.replicas);
    config.budget = script.budget();
    println!("replay: {} faults from {}", faults.len(), path.display());
    for t in &script.faults {
        println!("replay:   {t}");
    }
    anyhow::ensure!(
        !script.steps.is_empty(),
        "none of these faults is modelled: nothing to replay"
    );
    println!("model: {config}");
    let model = Replay {
        protocol: Protocol::new(config),
        steps: script.steps,
    };
    let verdict = explore(model, args);
    if verdict.violated {
        println!(
            "replay: a counterexample: the path above, with the run's faults in that order, breaks the contract in the model"
        );
        anyhow::bail!("the model breaks the contract under this run's faults");
    }
    if verdict.unreached.is_empty() {
        let bounds = if verdict.cut_short {
            "the states explored before the limit stopped the search"
        } else {
            "these bounds"
        };
        println!(
            "replay: no violation within {bounds}, and the run's faults were all taken: if the run broke the contract, the model may be missing what the code did, or a fault it leaves out or approximates (above) may be the cause"
        );
    } else {
        println!(
            "replay: inconclusive: no path within these bounds takes all of the run's faults; give more (--max-depth, --timeout, --resolution 4)"
        );
    }
    Ok(())
}

/// The bounds a run was given, to say what it covered.
struct Limits {
    max_states: usize,
    max_depth: usize,
    timeout: u64,
    started: Instant,
}

/// What a check found.
struct Verdict {
    /// An `always` property was violated.
    violated: bool,
    /// The `sometimes` properties never reached.
    unreached: Vec<&'static str>,
    /// The search stopped at the state or time limit.
    cut_short: bool,
}

impl Verdict {
    fn failed(&self) -> bool {
        self.violated || !self.unreached.is_empty()
    }
}

/// Prints what `checker` explored and each property's verdict.
fn report<M: Model>(checker: impl Checker<M>, limits: Limits) -> Verdict
where
    M::State: std::fmt::Debug + Clone + PartialEq,
    M::Action: std::fmt::Debug + Clone + PartialEq,
{
    let elapsed = limits.started.elapsed();
    let cut_short = (limits.max_states > 0 && checker.state_count() >= limits.max_states)
        || (limits.timeout > 0 && elapsed >= Duration::from_secs(limits.timeout));
    let covered = if cut_short {
        "stopped at the state or time limit".to_owned()
    } else if limits.max_depth > 0 && checker.max_depth() >= limits.max_depth {
        format!("every state within {} steps", limits.max_depth)
    } else {
        "the whole bounded space".to_owned()
    };
    println!(
        "model: {} states ({} unique), depth {}, {elapsed:.1?}, {covered}",
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth(),
    );
    let mut verdict = Verdict {
        violated: false,
        unreached: Vec::new(),
        cut_short,
    };
    for property in checker.model().properties() {
        let always = !matches!(property.expectation, stateright::Expectation::Sometimes);
        let found = checker.discovery(property.name);
        let said = match (always, &found) {
            (false, Some(_)) => "reached",
            (false, None) => "NEVER REACHED",
            (true, None) => "holds",
            (true, Some(_)) => "VIOLATED",
        };
        verdict.violated |= always && found.is_some();
        if !always && found.is_none() {
            verdict.unreached.push(property.name);
        }
        println!("model: {:<40} {said}", property.name);
        if let (true, Some(path)) = (always, found) {
            println!("model: path to the violation of {}:", property.name);
            let last = path.last_state().clone();
            for action in path.into_actions() {
                println!("    {action:?}");
            }
            println!("    last state: {last:#?}");
        }
    }
    verdict
}
