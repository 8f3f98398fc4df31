use super::*;

#[test]
fn a_variant_reads_back_as_it_prints_and_names_its_list_mode() {
    for name in [
        "kube-rs",
        "controller-runtime",
        "dispatch-1",
        "dispatch-paged-1",
        "dispatch-stream-4",
        "dispatch-alone-1",
        "dispatch-json-1",
        "dispatch-list-2",
        "go-dispatch-1",
        "dispatch-index-1",
        "controller-runtime-index",
        "go-dispatch-index-3",
    ] {
        let variant: Variant = name.parse().unwrap();
        assert_eq!(variant.to_string(), name);
    }
    let paged: Variant = "dispatch-paged-1".parse().unwrap();
    assert_eq!(paged.list_mode(), Some(ListMode::Paged));
    assert!(paged.on_tier() && paged.is_sdk_alone());
    assert_eq!("dispatch-1".parse::<Variant>().unwrap().list_mode(), None);
    let alone: Variant = "dispatch-alone-1".parse().unwrap();
    assert_eq!(alone.list_mode(), Some(ListMode::Alone));
    assert!(!ListMode::Alone.shared() && ListMode::Paged.shared());
    let json: Variant = "dispatch-json-1".parse().unwrap();
    assert_eq!(json.list_mode(), Some(ListMode::Json));
    assert!(ListMode::Json.shared() && !ListMode::Json.protobuf() && ListMode::Alone.protobuf());
    assert!(
        !"dispatch-stream-2"
            .parse::<Variant>()
            .unwrap()
            .is_sdk_alone()
    );
    let index: Variant = "go-dispatch-index-1".parse().unwrap();
    assert!(index.on_tier() && index.by_index() && !index.is_sdk_alone());
    assert!(
        "controller-runtime-index"
            .parse::<Variant>()
            .unwrap()
            .by_index()
    );
    assert!(!"controller-runtime".parse::<Variant>().unwrap().by_index());
    assert!("dispatch-paged-0".parse::<Variant>().is_err());
    assert!("dispatch-chunked-1".parse::<Variant>().is_err());
}
