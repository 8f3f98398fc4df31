use super::*;

/// Two groups over two kinds: each follows the writes to its own kind.
fn mixed(starts: [Vec<(u64, u64)>; 2]) -> Observations {
    let [config_maps, records] = starts;
    Observations {
        written: vec![
            [("ns/obj-000000".to_owned(), config_maps)].into(),
            [("ns/obj-000001".to_owned(), records)].into(),
        ],
        ..Observations::default()
    }
}

#[test]
fn a_variant_reads_back_as_it_prints_and_names_its_list_mode() {
    for name in [
        "kube-rs",
        "controller-runtime",
        "dispatch-1",
        "dispatch-paged-1",
        "dispatch-stream-4",
        "dispatch-list-2",
        "go-dispatch-1",
    ] {
        let variant: Variant = name.parse().unwrap();
        assert_eq!(variant.to_string(), name);
    }
    let paged: Variant = "dispatch-paged-1".parse().unwrap();
    assert_eq!(paged.list_mode(), Some(ListMode::Paged));
    assert!(paged.on_tier() && paged.is_sdk_alone());
    assert_eq!("dispatch-1".parse::<Variant>().unwrap().list_mode(), None);
    assert!(
        !"dispatch-stream-2"
            .parse::<Variant>()
            .unwrap()
            .is_sdk_alone()
    );
    assert!("dispatch-paged-0".parse::<Variant>().is_err());
    assert!("dispatch-chunked-1".parse::<Variant>().is_err());
}

#[test]
fn a_write_waits_only_for_the_groups_of_its_kind() {
    // The ConfigMap group saw the write (rv 7) at 30; the Record group never reconciled
    // the Record written.
    let o = mixed([vec![(10, 5), (30, 7), (40, 8)], Vec::new()]);
    assert_eq!(
        o.reconciled_after("ns/obj-000000", Write::Object(7)),
        Some(30)
    );
    assert_eq!(o.reconciled_after("ns/obj-000001", Write::Object(7)), None);
    // A reconcile of an older version does not count.
    assert_eq!(o.reconciled_after("ns/obj-000000", Write::Object(9)), None);
    // A key no group follows is never reconciled.
    assert_eq!(o.reconciled_after("ns/obj-000002", Write::Object(1)), None);
}

#[test]
fn a_write_waits_for_the_last_group_of_its_kind() {
    let o = Observations {
        written: vec![
            [("ns/a".to_owned(), vec![(20, 3)])].into(),
            [("ns/a".to_owned(), vec![(50, 3)])].into(),
            [("ns/b".to_owned(), vec![(5, 1)])].into(),
        ],
        ..Observations::default()
    };
    assert_eq!(o.reconciled_after("ns/a", Write::Object(3)), Some(50));
    assert_eq!(o.reconciled_after("ns/b", Write::Object(1)), Some(5));
}

/// A child's write is reconciled by the owner's first reconcile that starts after it,
/// whatever version of the owner that reconcile saw.
#[test]
fn a_childs_write_waits_for_the_owners_next_reconcile() {
    let o = mixed([vec![(10, 5), (30, 5), (40, 8)], Vec::new()]);
    assert_eq!(
        o.reconciled_after("ns/obj-000000", Write::Child(20)),
        Some(30)
    );
    assert_eq!(o.reconciled_after("ns/obj-000000", Write::Child(41)), None);
}
