use serde_json::{Value, json};

use super::*;
use crate::watch::protobuf::{
    table::BUILT_IN,
    testing::{Msg, number},
};

fn transcode(api_version: &str, kind: &str, message: &Msg) -> (Value, String, Range<usize>) {
    let ty = BUILT_IN.kind(api_version, kind).unwrap();
    let (text, metadata) = object(&BUILT_IN, ty, &message.0, Some((api_version, kind))).unwrap();
    (serde_json::from_str(&text).unwrap(), text, metadata)
}

#[test]
fn a_config_map_reads_as_the_api_server_writes_it() {
    // A map entry is a message of its key (1) and its value (2).
    let meta = Msg::default()
        .str(1, "settings")
        .str(3, "team-a")
        .str(5, "0b5f")
        .str(6, "42")
        .msg(8, Msg::default().varint(1, 1_700_000_000))
        .msg(11, Msg::default().str(1, "tier").str(2, "web"))
        .msg(11, Msg::default().str(1, "app").str(2, "shop"))
        .str(14, "example.com/cleanup");
    let config_map = Msg::default()
        .msg(1, meta)
        .msg(
            2,
            Msg::default().str(1, "mode").str(2, "fast <&> \"quoted\""),
        )
        .msg(3, Msg::default().str(1, "blob").bytes(2, &[0, 1, 2, 255]));
    let (value, text, metadata) = transcode("v1", "ConfigMap", &config_map);
    assert_eq!(
        value,
        json!({
            "kind": "ConfigMap",
            "apiVersion": "v1",
            "metadata": {
                "name": "settings",
                "namespace": "team-a",
                "uid": "0b5f",
                "resourceVersion": "42",
                "creationTimestamp": "2023-11-14T22:13:20Z",
                "labels": {"app": "shop", "tier": "web"},
                "finalizers": ["example.com/cleanup"],
            },
            "data": {"mode": "fast <&> \"quoted\""},
            "binaryData": {"blob": "AAEC/w=="},
        })
    );
    let meta: Value = serde_json::from_str(&text[metadata]).unwrap();
    assert_eq!(meta, value["metadata"]);
}

#[test]
fn pointers_are_written_when_set_and_plain_zeros_left_out() {
    let spec = |replicas: Option<u64>| {
        let mut spec = Msg::default();
        if let Some(r) = replicas {
            spec = spec.varint(number("apps/v1.DeploymentSpec", "replicas"), r);
        }
        let surge = Msg::default().varint(1, 1).str(3, "25%");
        let unavailable = Msg::default().varint(1, 0).varint(2, 1);
        let rolling = Msg::default()
            .msg(number("apps/v1.RollingUpdateDeployment", "maxSurge"), surge)
            .msg(
                number("apps/v1.RollingUpdateDeployment", "maxUnavailable"),
                unavailable,
            );
        spec.varint(number("apps/v1.DeploymentSpec", "minReadySeconds"), 0)
            .msg(
                number("apps/v1.DeploymentSpec", "strategy"),
                Msg::default()
                    .str(
                        number("apps/v1.DeploymentStrategy", "type"),
                        "RollingUpdate",
                    )
                    .msg(
                        number("apps/v1.DeploymentStrategy", "rollingUpdate"),
                        rolling,
                    ),
            )
    };
    // As the API server sends them: the template and the status, structs, are on the wire even
    // when empty.
    let template = Msg::default()
        .msg(
            number("core/v1.PodTemplateSpec", "metadata"),
            Msg::default(),
        )
        .msg(number("core/v1.PodTemplateSpec", "spec"), Msg::default());
    let deployment = |replicas| {
        Msg::default()
            .msg(1, Msg::default().str(1, "web"))
            .msg(
                number("apps/v1.Deployment", "spec"),
                spec(replicas).msg(
                    number("apps/v1.DeploymentSpec", "template"),
                    template.clone(),
                ),
            )
            .msg(number("apps/v1.Deployment", "status"), Msg::default())
    };
    let (value, _, _) = transcode("apps/v1", "Deployment", &deployment(Some(0)));
    let spec_json = &value["spec"];
    assert_eq!(spec_json["replicas"], json!(0), "{value}");
    assert!(spec_json.get("minReadySeconds").is_none(), "{value}");
    // `selector` is a pointer without omitempty: null when absent.
    assert_eq!(spec_json["selector"], Value::Null);
    assert!(spec_json.as_object().unwrap().contains_key("selector"));
    assert_eq!(
        spec_json["strategy"],
        json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1, "maxSurge": "25%"}})
    );
    // The template is a struct: written even when empty, with what is written of its zero
    // fields (a nil list without omitempty is null).
    assert_eq!(
        spec_json["template"],
        json!({"metadata": {}, "spec": {"containers": null}})
    );
    assert_eq!(value["status"], json!({}));
    let (without, _, _) = transcode("apps/v1", "Deployment", &deployment(None));
    assert!(without["spec"].get("replicas").is_none());
    // A struct, string, number or boolean that is not a pointer is always on the wire: one
    // that is not is a field the API server's release does not have, and its JSON has none
    // either (a 1.36 server and a CSINode's status, which came in 1.37).
    let older = Msg::default()
        .msg(1, Msg::default().str(1, "web"))
        .msg(number("apps/v1.Deployment", "spec"), Msg::default());
    let (older, _, _) = transcode("apps/v1", "Deployment", &older);
    assert_eq!(older["spec"].get("template"), None, "{older}");
    assert_eq!(older.get("status"), None, "{older}");
    assert_eq!(older["spec"]["selector"], Value::Null, "{older}");
}

#[test]
fn times_are_written_to_their_precision_and_zero_is_null() {
    let stamp = Msg::default()
        .varint(1, 1_700_000_000)
        .varint(2, 123_456_789);
    // A Lease's renewTime is a MicroTime, its acquireTime too; a Time drops the nanoseconds.
    let lease = Msg::default()
        .msg(1, Msg::default().str(1, "l").msg(8, stamp.clone()))
        .msg(
            2,
            Msg::default()
                .msg(
                    number("coordination/v1.LeaseSpec", "renewTime"),
                    stamp.clone(),
                )
                .msg(
                    number("coordination/v1.LeaseSpec", "acquireTime"),
                    Msg::default(),
                ),
        );
    let (value, _, _) = transcode("coordination.k8s.io/v1", "Lease", &lease);
    assert_eq!(
        value["metadata"]["creationTimestamp"],
        json!("2023-11-14T22:13:20Z")
    );
    assert_eq!(
        value["spec"]["renewTime"],
        json!("2023-11-14T22:13:20.123456Z")
    );
    // A pointer to a time on the wire with no bytes: Go's zero time, which JSON writes as null.
    assert_eq!(value["spec"]["acquireTime"], Value::Null);
    // creationTimestamp is `omitzero`: left out when zero.
    let bare = Msg::default().msg(1, Msg::default().str(1, "l").msg(8, Msg::default()));
    let (value, _, _) = transcode("coordination.k8s.io/v1", "Lease", &bare);
    assert!(
        value["metadata"].get("creationTimestamp").is_none(),
        "{value}"
    );
    let year_one = Msg::default().varint(1, ZERO_TIME_SECONDS as u64);
    let at_zero = Msg::default().msg(1, Msg::default().str(1, "l").msg(8, year_one));
    let (value, _, _) = transcode("coordination.k8s.io/v1", "Lease", &at_zero);
    assert!(
        value["metadata"].get("creationTimestamp").is_none(),
        "{value}"
    );
}

#[test]
fn durations_read_as_go_writes_them() {
    for (nanos, text) in [
        (0, "0s"),
        (1, "1ns"),
        (1_100, "1.1µs"),
        (2_200_000, "2.2ms"),
        (3_300_000_000, "3.3s"),
        (245_000_000_000, "4m5s"),
        (245_001_000_000, "4m5.001s"),
        (18_367_001_000_000, "5h6m7.001s"),
        (480_000_000_001, "8m0.000000001s"),
        (3_600_000_000_000, "1h0m0s"),
        (-1_500_000_000, "-1.5s"),
        (i64::MIN, "-2562047h47m16.854775808s"),
        (i64::MAX, "2562047h47m16.854775807s"),
    ] {
        assert_eq!(go_duration(nanos), text, "{nanos}");
    }
}

#[test]
fn a_field_the_table_does_not_know_is_refused_by_name() {
    let config_map = Msg::default()
        .msg(1, Msg::default().str(1, "a"))
        .str(99, "new");
    let ty = BUILT_IN.kind("v1", "ConfigMap").unwrap();
    let error = object(&BUILT_IN, ty, &config_map.0, None).unwrap_err();
    assert_eq!(
        error,
        Untranscodable::UnknownField {
            ty: "k8s.io/api/core/v1.ConfigMap".into(),
            number: 99
        }
    );
    // The wire contradicting the table (a string where a varint belongs) is refused too.
    let wrong = Msg::default().msg(1, Msg::default().str(7, "generation"));
    assert!(matches!(
        object(&BUILT_IN, ty, &wrong.0, None),
        Err(Untranscodable::Unexpected(_))
    ));
    // And bytes cut short.
    let mut cut = config_map.0.clone();
    cut.truncate(3);
    assert!(object(&BUILT_IN, ty, &cut, None).is_err());
}

#[test]
fn raw_fields_must_be_json() {
    let managed = |raw: &[u8]| {
        let entry = Msg::default()
            .str(number("meta/v1.ManagedFieldsEntry", "manager"), "kubectl")
            .msg(
                number("meta/v1.ManagedFieldsEntry", "fieldsV1"),
                Msg::default().bytes(1, raw),
            );
        Msg::default().msg(1, Msg::default().str(1, "a").msg(17, entry))
    };
    let (value, _, _) = transcode("v1", "ConfigMap", &managed(br#"{"f:data": {}}"#));
    assert_eq!(
        value["metadata"]["managedFields"],
        json!([{"manager": "kubectl", "fieldsV1": {"f:data": {}}}])
    );
    let ty = BUILT_IN.kind("v1", "ConfigMap").unwrap();
    let cbor = managed(&[0xd9, 0xd9, 0xf7, 0xa0]);
    assert!(object(&BUILT_IN, ty, &cbor.0, None).is_err());
}

#[test]
#[ignore = "a measurement: cargo test --release -- --ignored --nocapture transcoding_speed"]
fn transcoding_speed() {
    let data = "x".repeat(2048);
    let meta = Msg::default()
        .str(1, "settings-12345")
        .str(3, "team-a")
        .str(5, "0b5f0b5f-0b5f-0b5f-0b5f-0b5f0b5f0b5f")
        .str(6, "424242")
        .msg(8, Msg::default().varint(1, 1_700_000_000))
        .msg(11, Msg::default().str(1, "app").str(2, "shop"));
    let config_map = Msg::default()
        .msg(1, meta)
        .msg(2, Msg::default().str(1, "value").str(2, &data));
    let ty = BUILT_IN.kind("v1", "ConfigMap").unwrap();
    let start = std::time::Instant::now();
    let n = 100_000;
    for _ in 0..n {
        let (text, _) = object(&BUILT_IN, ty, &config_map.0, None).unwrap();
        std::hint::black_box(text);
    }
    let per = start.elapsed() / n;
    println!("{per:?} per 2 KiB ConfigMap");
}

#[test]
fn bytes_that_are_not_utf8_read_as_go_writes_them() {
    // Go's encoding/json writes each byte outside valid UTF-8 as U+FFFD: two for a cut
    // three-byte sequence, where a lossy conversion writes one.
    let config_map = Msg::default()
        .msg(1, Msg::default().str(1, "a"))
        .msg(2, Msg::default().str(1, "k").bytes(2, b"a\xe2\x82b\xff"));
    let ty = BUILT_IN.kind("v1", "ConfigMap").unwrap();
    let (text, _) = object(&BUILT_IN, ty, &config_map.0, None).unwrap();
    let value: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(value["data"]["k"], json!("a\u{fffd}\u{fffd}b\u{fffd}"));
}

#[test]
fn an_object_nested_past_the_bound_is_refused_as_a_bound() {
    // A type that holds a list of itself (a scheduling group template of groups).
    let (index, field) = BUILT_IN
        .types
        .iter()
        .enumerate()
        .find_map(|(i, t)| {
            t.fields.iter().find_map(|f| match &f.shape {
                Shape::List(inner) if **inner == Shape::Message(i as u32) => Some((i, f.number)),
                _ => None,
            })
        })
        .expect("a type that holds a list of itself");
    let nested =
        |depth: usize| (0..depth).fold(Msg::default(), |inner, _| Msg::default().msg(field, inner));
    assert!(object(&BUILT_IN, index as u32, &nested(20).0, None).is_ok());
    let error = object(&BUILT_IN, index as u32, &nested(MAX_DEPTH + 5).0, None).unwrap_err();
    assert!(matches!(error, Untranscodable::Bound(_)), "{error}");
}
