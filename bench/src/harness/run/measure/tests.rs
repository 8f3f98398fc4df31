use super::*;

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
