use std::io;

use futures::{StreamExt, TryStreamExt};
use kube::{ResourceExt, api::WatchEvent};

use super::*;
use crate::watch::protobuf::{
    needs_json, read_error,
    testing::{Msg, config_map, envelope, list},
};

/// A body that arrives `chunk` bytes at a time.
fn body(bytes: Vec<u8>, chunk: usize) -> Body {
    let chunks: Vec<io::Result<Vec<u8>>> = bytes.chunks(chunk).map(|c| Ok(c.to_vec())).collect();
    Box::pin(futures::stream::iter(chunks).into_async_read())
}

/// An envelope whose list's length is made to cover whatever follows its header (a list built
/// by hand, then appended to).
fn relength(envelope: Vec<u8>) -> Vec<u8> {
    // The envelope: magic, field 1 (types), field 2 (the list) with its length.
    let types_len = envelope[5] as usize;
    let list_at = 6 + types_len;
    assert_eq!(envelope[list_at], 0x12);
    let mut rest = &envelope[list_at + 1..];
    let old_len = prost::encoding::decode_varint(&mut rest).unwrap() as usize;
    let header = envelope.len() - list_at - 1 - rest.len();
    let body = &envelope[list_at + 1 + header..];
    assert!(body.len() >= old_len);
    let mut out = envelope[..=list_at].to_vec();
    prost::encoding::encode_varint(body.len() as u64, &mut out);
    out.extend_from_slice(body);
    out
}

async fn read_all(mut reader: ListReader) -> io::Result<(Vec<WatchedObject>, ListReader)> {
    let mut objects = Vec::new();
    while let Some(object) = reader.next().await? {
        objects.push(object);
    }
    Ok((objects, reader))
}

#[tokio::test]
async fn a_list_is_read_an_item_at_a_time_however_its_bytes_arrive() {
    let items = [config_map("a", "5", "x"), config_map("b", "6", "y")];
    let bytes = list(&items, "next");
    for chunk in [1, 3, 7, bytes.len()] {
        let (objects, reader) = read_all(ListReader::new(body(bytes.clone(), chunk), None))
            .await
            .unwrap();
        let names: Vec<_> = objects.iter().map(|o| o.name_any()).collect();
        assert_eq!(names, ["a", "b"], "chunks of {chunk}");
        assert!(objects.iter().all(WatchedObject::read_in_protobuf));
        let json: serde_json::Value = serde_json::from_str(objects[1].json().unwrap()).unwrap();
        assert_eq!(json["data"], serde_json::json!({"k": "y"}));
        // Items of a list carry no type of their own, as in JSON.
        assert!(json.get("kind").is_none());
        // Read for a watch of their type, each is written with it, as a watch event's object.
        let types = TypeMeta {
            api_version: "v1".into(),
            kind: "ConfigMap".into(),
        };
        let typed_reader =
            ListReader::new(body(bytes.clone(), chunk), Some(Arc::new(types.clone())));
        let (typed_objects, _) = read_all(typed_reader).await.unwrap();
        let body = typed_objects[1].full_body(&types).unwrap();
        let text = typed_objects[1].json().unwrap();
        assert_eq!(body.as_ptr(), text.as_ptr(), "not copied");
        let typed: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            (&typed["kind"], &typed["apiVersion"]),
            (&"ConfigMap".into(), &"v1".into())
        );
        assert_eq!(typed["data"], json["data"]);
        assert_eq!(typed["metadata"], json["metadata"]);
        assert_eq!(reader.resource_version(), Some("7"));
        assert_eq!(reader.continue_token(), Some("next"));
    }
    let (objects, reader) = read_all(ListReader::new(body(list(&[], ""), 2), None))
        .await
        .unwrap();
    assert!(objects.is_empty());
    assert_eq!(
        (reader.resource_version(), reader.continue_token()),
        (Some("7"), None)
    );
}

#[tokio::test]
async fn a_list_the_table_cannot_read_or_cut_short_fails_as_such() {
    // A field the table does not know: the object is read, with its routing fields, and
    // writing its JSON fails as what JSON reads.
    let newer = config_map("a", "5", "x").str(99, "new");
    let (objects, _) = read_all(ListReader::new(body(list(&[newer], ""), 5), None))
        .await
        .unwrap();
    assert_eq!(objects[0].resource_version().as_deref(), Some("5"));
    assert_eq!(objects[0].json(), None);
    let error = objects[0].transcoded().unwrap_err();
    assert!(
        matches!(error, Untranscodable::UnknownField { number: 99, .. }),
        "{error}"
    );
    assert!(needs_json(&read_error(error)));
    // Cut short: an error, but not one JSON would read any better.
    let mut cut = list(&[config_map("a", "5", "x")], "");
    cut.truncate(cut.len() - 3);
    let error = read_all(ListReader::new(body(cut, 4), None))
        .await
        .err()
        .unwrap();
    assert_eq!(error.kind(), io::ErrorKind::UnexpectedEof);
    assert!(!needs_json(&kube::Error::ReadEvents(error)));
    // An item that says it is larger than a dispatcher reads: past a bound, which JSON meets
    // too.
    let mut huge = list(&[], "");
    huge.extend_from_slice(&[0x12, 0x80, 0x80, 0x80, 0x80, 0x04]); // an item of 1 GiB
    let error = read_all(ListReader::new(body(relength(huge), 4), None))
        .await
        .err()
        .unwrap();
    assert!(error.to_string().contains("over the"), "{error}");
    assert!(!needs_json(&kube::Error::ReadEvents(error)));
    // Field keys protobuf does not allow: a field number 0, a key past 32 bits.
    for key in [&[0x02][..], &[0x82, 0x80, 0x80, 0x80, 0x10]] {
        let mut bad = list(&[], "");
        bad.extend_from_slice(key);
        bad.push(0);
        let error = read_all(ListReader::new(body(relength(bad), 3), None))
            .await
            .err()
            .unwrap();
        assert!(error.to_string().contains("a field key of"), "{error}");
    }
    // Not protobuf at all.
    let error = read_all(ListReader::new(body(b"{\"items\":[]}".to_vec(), 4), None))
        .await
        .err()
        .unwrap();
    assert!(error.to_string().contains("magic"), "{error}");
}

/// A watch frame: the event's length, then the event.
fn frame(kind: &str, object: Vec<u8>) -> Vec<u8> {
    let event = Msg::default()
        .str(1, kind)
        .msg(2, Msg::default().bytes(1, &object));
    let mut bytes = (event.0.len() as u32).to_be_bytes().to_vec();
    bytes.extend_from_slice(&event.0);
    bytes
}

#[tokio::test]
async fn watch_frames_read_as_kube_reads_json_events() {
    let bookmark = Msg::default().msg(1, Msg::default().str(6, "12"));
    let status = Msg::default()
        .str(2, "Failure")
        .str(3, "too old resource version")
        .str(4, "Expired")
        .varint(6, 410);
    let mut bytes = frame(
        "ADDED",
        envelope("v1", "ConfigMap", &config_map("a", "10", "x")),
    );
    bytes.extend(frame(
        "DELETED",
        envelope("v1", "ConfigMap", &config_map("a", "11", "x")),
    ));
    bytes.extend(frame("BOOKMARK", envelope("v1", "ConfigMap", &bookmark)));
    bytes.extend(frame("ERROR", envelope("v1", "Status", &status)));
    // The watch's type is shared by the objects that name it, not copied for each.
    let types = Arc::new(TypeMeta {
        api_version: "v1".into(),
        kind: "ConfigMap".into(),
    });
    let read: Vec<_> = events(body(bytes, 3), Some(types.clone()))
        .try_collect()
        .await
        .unwrap();
    // This test's and the added and deleted objects'.
    assert_eq!(
        Arc::strong_count(&types),
        3,
        "the objects share the watch's type"
    );
    match &read[..] {
        [
            WatchEvent::Added(added),
            WatchEvent::Deleted(deleted),
            WatchEvent::Bookmark(bookmark),
            WatchEvent::Error(status),
        ] => {
            assert_eq!(added.resource_version().as_deref(), Some("10"));
            let json: serde_json::Value = serde_json::from_str(added.json().unwrap()).unwrap();
            assert_eq!(
                (&json["kind"], &json["apiVersion"]),
                (&"ConfigMap".into(), &"v1".into())
            );
            assert_eq!(deleted.resource_version().as_deref(), Some("11"));
            assert_eq!(bookmark.metadata.resource_version, "12");
            assert_eq!((status.code, status.reason.as_str()), (410, "Expired"));
        }
        other => panic!("{other:?}"),
    }
    // A frame cut short ends the stream with an error; one the table cannot read says so.
    let mut cut = frame(
        "ADDED",
        envelope("v1", "ConfigMap", &config_map("a", "10", "x")),
    );
    cut.truncate(cut.len() - 1);
    let read: Vec<_> = events(body(cut, 3), None).collect().await;
    assert!(matches!(&read[..], [Err(e)] if !needs_json(e)), "{read:?}");
    let newer = envelope(
        "v1",
        "ConfigMap",
        &config_map("a", "10", "x").str(99, "new"),
    );
    let read: Vec<_> = events(body(frame("MODIFIED", newer), 64), None)
        .collect()
        .await;
    match &read[..] {
        [Ok(WatchEvent::Modified(newer))] => {
            assert_eq!(newer.name_any(), "a");
            assert!(needs_json(&read_error(newer.transcoded().unwrap_err())));
        }
        other => panic!("{other:?}"),
    }
}
