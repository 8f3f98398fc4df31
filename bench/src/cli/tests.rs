use clap::CommandFactory as _;

use std::time::Duration;

use super::*;

fn parse(args: &[&str]) -> Result<Bench, clap::Error> {
    Cli::try_parse_from(std::iter::once("kube-dispatch-bench").chain(args.iter().copied()))
        .map(|cli| cli.bench)
}

#[test]
fn the_command_line_is_consistent() {
    Cli::command().debug_assert();
}

#[test]
fn every_benchmark_is_a_subcommand_and_one_is_needed() {
    assert!(parse(&[]).is_err());
    assert!(parse(&["--security"]).is_err());
    for name in [
        "compare", "security", "hostile", "metrics", "ceiling", "shards",
    ] {
        assert!(parse(&[name]).is_ok(), "{name}");
    }
}

#[test]
fn the_defaults_the_make_targets_relied_on_are_the_subcommands_own() {
    let Ok(Bench::Shards(shards)) = parse(&["shards"]) else {
        panic!("shards parses");
    };
    assert_eq!(
        (shards.namespaces, shards.objects, shards.writes),
        (1000, 100, 1000)
    );
    assert_eq!(shards.write_interval, Duration::from_millis(10));
    let Ok(Bench::Ceiling(ceiling)) = parse(&["ceiling", "--rates", "20,40", "--window", "1s"])
    else {
        panic!("ceiling parses");
    };
    assert_eq!(
        (ceiling.objects, ceiling.rates, ceiling.window),
        (2000, vec![20, 40], Duration::from_secs(1))
    );
    let Ok(Bench::Metrics(metrics)) = parse(&["metrics"]) else {
        panic!("metrics parses");
    };
    assert_eq!((metrics.objects, metrics.repeats), (2000, 5));
    let Ok(Bench::Hostile(hostile)) = parse(&["hostile"]) else {
        panic!("hostile parses");
    };
    assert_eq!((hostile.repeats, hostile.writes), (3, 100));
    let Ok(Bench::Security(security)) = parse(&["security"]) else {
        panic!("security parses");
    };
    assert_eq!(
        (security.repeats, security.writes, security.opens),
        (3, 200, 50)
    );
    assert_eq!(
        security.output.command("make bench-security"),
        "make bench-security"
    );
}

#[test]
fn counts_must_be_positive_and_flags_belong_to_their_subcommand() {
    for args in [
        &["compare", "--objects", "10,0"][..],
        &["compare", "--repeats", "0"],
        &["compare", "--namespaces", "0"],
        &["compare", "--dispatchers", "17"],
        &["metrics", "--objects", "0"],
        &["ceiling", "--rates", "100,0"],
        &["shards", "--namespaces", "0"],
        &["security", "--sessions", "0"],
        &["security", "--identities", "0"],
        &["hostile", "--writes", "0"],
        // Each subcommand has only the flags it uses.
        &["metrics", "--bin-dir", "x"],
        &["security", "--plots-dir", "x"],
        &["ceiling", "--variants", "kube-rs"],
    ] {
        assert!(parse(args).is_err(), "{args:?} parsed");
    }
}

#[test]
fn each_section_gets_its_page_unless_a_markdown_file_is_named() {
    let Bench::Compare(args) = parse(&["compare"]).expect("compare parses") else {
        panic!("compare is the compare benchmark");
    };
    assert_eq!(
        args.output.page("groups"),
        std::path::Path::new("bench/results/groups.md")
    );
    assert_eq!(
        args.output.pages_dir(),
        std::path::Path::new("bench/results")
    );
    let Bench::Compare(args) =
        parse(&["compare", "--out", "/tmp/x/BENCHMARKS.md"]).expect("--out parses")
    else {
        panic!("compare is the compare benchmark");
    };
    assert_eq!(
        args.output.page("groups"),
        std::path::Path::new("/tmp/x/BENCHMARKS.md")
    );
    assert_eq!(args.output.pages_dir(), std::path::Path::new("/tmp/x"));
}
