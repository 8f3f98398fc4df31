use super::{report::table, *};

fn measured(shape: Shape, event: Event, run: usize, above: Option<f64>, max_ms: f64) -> Measured {
    Measured {
        shape,
        event,
        run,
        recovered_s: 1.0,
        window_s: 10.0,
        apiserver_cpu_s: 1.0 + above.unwrap_or(0.0),
        above_steady_s: above,
        cpu_recovered_s: 0.5,
        lists: 1,
        watch_lists: 2,
        gets: 3,
        patches: 0,
        writes: 100,
        p50_ms: 4.0,
        p99_ms: 9.0,
        max_ms,
        rss_mib: 100.0,
        cold_start_s: (event == Event::Steady).then_some(2.0),
        judged_dead: 0,
    }
}

#[test]
fn the_table_sets_each_incumbent_against_the_tier_with_medians_of_the_runs() {
    let runs = [
        measured(Shape::Tier, Event::Steady, 0, None, 10.0),
        measured(Shape::Tier, Event::Rollout, 0, Some(0.1), 20.0),
        measured(Shape::Tier, Event::Rollout, 1, Some(0.3), 40.0),
        measured(Shape::ControllerRuntimeLeader, Event::Steady, 0, None, 10.0),
        measured(
            Shape::ControllerRuntimeLeader,
            Event::Rollout,
            0,
            Some(1.0),
            3000.0,
        ),
        measured(
            Shape::ControllerRuntimeLeader,
            Event::Rollout,
            1,
            Some(1.4),
            5000.0,
        ),
    ];
    let table = table(&runs);
    let row = |start: &str| {
        table
            .lines()
            .find(|l| l.starts_with(start))
            .unwrap_or_else(|| panic!("no row {start:?} in\n{table}"))
            .to_owned()
    };
    // Medians: the tier 0.2 s above steady and 30 ms at most; controller-runtime 1.2 s and
    // 4000 ms.
    let incumbent = row("| controller rollout | controller-runtime, cold standby |");
    assert!(incumbent.contains("| 1.20 |"), "{incumbent}");
    assert!(incumbent.ends_with("| 6.00× | 133.33× |"), "{incumbent}");
    let tier = row("| controller rollout | kube-dispatch |");
    assert!(tier.contains("| 0.20 |"), "{tier}");
    assert!(tier.ends_with("| – | – |"), "{tier}");
    // The steady window has nothing above itself.
    let steady = row("| steady | controller-runtime, cold standby |");
    assert!(steady.contains("| 1.00 | – | 1 / 2 / 3 |"), "{steady}");
    // Each shape's cold start and memory, against the tier's.
    let shape = row("| controller-runtime, cold standby | 2.00 | 100.0 | 1.00× |");
    assert!(table.find(&shape) < table.find("| steady |"), "{table}");
    // Events come in their order, steady first.
    assert!(table.find("| steady |") < table.find("| controller rollout |"));
}

#[test]
fn only_the_tier_meets_a_tier_upgrade_and_every_shape_starts_steady() {
    for shape in [
        Shape::KubeRsStandby,
        Shape::ControllerRuntimeLeader,
        Shape::ControllerRuntimeWarm,
        Shape::Tier,
    ] {
        assert_eq!(shape.events()[0], Event::Steady);
        assert_eq!(
            shape.events().contains(&Event::TierUpgrade),
            shape == Shape::Tier
        );
        // Every incumbent shape elects a leader; the tier's replicas share the keys.
        assert_eq!(
            shape.args().contains(&"--leader-elect"),
            shape != Shape::Tier
        );
    }
    assert_eq!(Shape::Tier.variant(), Variant::Dispatch(REPLICAS));
    assert!(Shape::ControllerRuntimeWarm.args().contains(&"--warmup"));
}

/// What an event would have cost at the steady window's rates: its rate while its writer
/// wrote over the event's writing time, and its rate after over the rest.
#[test]
fn an_event_is_set_against_the_steady_rates_of_writing_and_of_quiet() {
    let steady = Measured {
        recovered_s: 10.0,
        window_s: 20.0,
        cpu_recovered_s: 2.0,
        apiserver_cpu_s: 3.0,
        ..measured(Shape::Tier, Event::Steady, 0, None, 1.0)
    };
    let rates = Rates::of(&steady);
    assert!((rates.writing - 0.2).abs() < 1e-9, "{rates:?}");
    assert!((rates.after - 0.1).abs() < 1e-9, "{rates:?}");
    // 5 s of writing and 10 s of quiet after.
    assert!((rates.expected(5.0, 15.0) - 2.0).abs() < 1e-9);
    // A window no longer than its writing has no quiet part.
    assert!((rates.expected(5.0, 4.0) - 1.0).abs() < 1e-9);
}

#[test]
fn a_member_judged_dead_in_any_run_is_named_under_the_table() {
    let mut upgrade = measured(Shape::Tier, Event::TierUpgrade, 1, Some(1.0), 10.0);
    let runs = [
        measured(Shape::Tier, Event::Steady, 0, None, 10.0),
        measured(Shape::Tier, Event::TierUpgrade, 0, Some(1.0), 10.0),
        upgrade.clone(),
    ];
    assert!(!table(&runs).contains("Judgements"), "{}", table(&runs));
    upgrade.judged_dead = 1;
    let runs = [runs[0].clone(), runs[1].clone(), upgrade];
    let table = table(&runs);
    assert!(
        table.contains("died, one per dispatcher that saw it (the keys that move from each wait, up to the handover bound): 1 in the tier upgrade of run 2."),
        "{table}"
    );
}
