//! A LIST response read one object at a time, as it arrives.
//!
//! A watch that lists whole (`--list-mode whole`) asks for all but a first page in one
//! response: the API server serves it from its watch cache and writes it an item at a time
//! (streaming collection encoding, GA in Kubernetes 1.34). Read whole, such a response would cost the
//! dispatcher memory in proportion to every object of the resource. [`ListReader`] keeps only
//! what it has received of the object it is reading: its buffer holds at most about twice the
//! largest object, and never more than [`MAX_OBJECT_BYTES`] unread.
//!
//! The list's own fields (`kind`, `apiVersion`, `metadata`, `items`, in whatever order) are
//! walked here; every value, each object's text included, is read by `serde_json`. An object
//! is scanned once: the pass that finds where it ends also finds its metadata, from which its
//! routing fields are then read ([`WatchedObject::from_layout`]); it was scanned twice before,
//! about a quarter of a dispatcher's work at a cold start.

use std::{io, pin::Pin, sync::Arc};

use futures::{AsyncBufRead, AsyncBufReadExt};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ListMeta;
use serde::{Deserialize, de::IgnoredAny};

use super::object::{Head, Layout, WatchedObject};

/// The body of a list response, read as it arrives.
pub(super) type Body = Pin<Box<dyn AsyncBufRead + Send>>;

/// Marks a response that is JSON but holds what the dispatcher cannot read (an object whose
/// metadata is not an object's, a list's metadata of the wrong shape): not a response cut
/// short, so the list is made again the same way after a backoff, not another way
/// (`super::whole_list::cut_short`).
#[derive(Debug, thiserror::Error)]
#[error("reading a list response: {0}")]
pub(super) struct Unreadable(String);

/// Whether `error`, met reading a list, is [`Unreadable`].
pub(super) fn unreadable(error: &io::Error) -> bool {
    error.get_ref().is_some_and(|e| e.is::<Unreadable>())
}

fn unreadable_error(message: impl std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, Unreadable(message.to_string()))
}

/// Most bytes of one object the reader holds before it gives up on the response. The API
/// server refuses requests over 3 MiB and etcd values over 1.5 MiB by default; this leaves room
/// for any setting of theirs and still bounds what one bad response can make a dispatcher hold.
pub(super) const MAX_OBJECT_BYTES: usize = 64 << 20;

/// What the reader expects next in the response.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Expect {
    /// The `{` that opens the list.
    Open,
    /// A field of the list, or its end; `first` before the first field.
    Field { first: bool },
    /// An object of `items`, or the array's end; `first` before the first object.
    Item { first: bool },
    /// Nothing: the list has ended.
    End,
}

/// What one step over the buffered input found.
enum Step {
    /// An object of `items`: its text, and where its metadata is ([`Head::layout`]).
    Object(Arc<str>, Layout),
    /// Something other than an object was read (a field, a bracket).
    Read,
    /// The list ended.
    End,
    /// The input ends before the next thing does: more must be read.
    Short,
}

/// A LIST response's objects, read one at a time from its body (see the module docs).
pub(super) struct ListReader<R> {
    body: R,
    /// Received and not yet read, from `at` on.
    buf: Vec<u8>,
    at: usize,
    expect: Expect,
    /// Bytes to have unread before trying again after running short: doubling what was there,
    /// so an object that arrives in many pieces is parsed a bounded number of times.
    want: usize,
    /// Whether the body has ended.
    eof: bool,
    resource_version: Option<String>,
    continue_token: Option<String>,
}

impl<R: AsyncBufRead + Unpin> ListReader<R> {
    /// A reader of the list response `body`.
    pub(super) fn new(body: R) -> Self {
        Self {
            body,
            buf: Vec::new(),
            at: 0,
            expect: Expect::Open,
            want: 1,
            eof: false,
            resource_version: None,
            continue_token: None,
        }
    }

    /// The list's resourceVersion, once [`Self::next`] has returned `None` (the API server
    /// writes the list's metadata before its items, but any order is read).
    pub(super) fn resource_version(&self) -> Option<&str> {
        self.resource_version.as_deref()
    }

    /// Where the list goes on, if the response was a page of it: the token of its `continue`,
    /// once [`Self::next`] has returned `None`.
    pub(super) fn continue_token(&self) -> Option<&str> {
        self.continue_token.as_deref().filter(|t| !t.is_empty())
    }

    /// The next object, or `None` when the list has ended. An error is final: the response was
    /// cut short, is not a list, or holds an object over [`MAX_OBJECT_BYTES`] or one without
    /// readable metadata.
    pub(super) async fn next(&mut self) -> io::Result<Option<WatchedObject>> {
        // A list's objects are often all buffered already, so reading them never waits: count
        // each against the task's budget, so that a long list lets the dispatcher's other tasks
        // (its Lease renewal, the sessions) run.
        tokio::task::coop::consume_budget().await;
        loop {
            match self.step()? {
                Step::Object(text, layout) => {
                    self.want = 1;
                    return WatchedObject::from_layout(text, layout)
                        .map(Some)
                        .map_err(unreadable_error);
                }
                Step::Read => self.want = 1,
                Step::End => return Ok(None),
                Step::Short => {
                    let unread = self.buf.len() - self.at;
                    if self.eof {
                        return Err(invalid("the list response ended before the list did"));
                    }
                    if unread > MAX_OBJECT_BYTES {
                        return Err(too_large());
                    }
                    self.want = (unread * 2).max(unread + 1).min(MAX_OBJECT_BYTES + 1);
                    while !self.eof && self.buf.len() - self.at < self.want {
                        self.fill().await?;
                    }
                }
            }
        }
    }

    /// Appends what the body has next to the buffer, first dropping what has been read.
    async fn fill(&mut self) -> io::Result<()> {
        if self.at > 0 {
            self.buf.drain(..self.at);
            self.at = 0;
        }
        let chunk = self.body.fill_buf().await?;
        if chunk.is_empty() {
            self.eof = true;
            return Ok(());
        }
        let n = chunk.len();
        self.buf.extend_from_slice(chunk);
        self.body.consume_unpin(n);
        Ok(())
    }

    /// Reads the next thing the list holds from the buffer, if it is all there.
    fn step(&mut self) -> io::Result<Step> {
        let input = &self.buf[self.at..];
        let mut at = skip_whitespace(input, 0);
        let Some(&byte) = input.get(at) else {
            return Ok(Step::Short);
        };
        match self.expect {
            Expect::Open => {
                if byte != b'{' {
                    return Err(invalid("a list response is a JSON object"));
                }
                self.at += at + 1;
                self.expect = Expect::Field { first: true };
                Ok(Step::Read)
            }
            Expect::Field { first } => {
                if byte == b'}' {
                    self.at += at + 1;
                    self.expect = Expect::End;
                    return Ok(Step::End);
                }
                if !first {
                    at = after(input, at, b',')?;
                }
                let Some((name, end)) = value::<String>(input, at, self.eof)? else {
                    return Ok(Step::Short);
                };
                at = skip_whitespace(input, end);
                if at == input.len() {
                    return Ok(Step::Short);
                }
                at = skip_whitespace(input, after(input, at, b':')?);
                let Some(&first_byte) = input.get(at) else {
                    return Ok(Step::Short);
                };
                let end = match name.as_str() {
                    "items" if first_byte == b'[' => {
                        self.at += at + 1;
                        self.expect = Expect::Item { first: true };
                        return Ok(Step::Read);
                    }
                    "metadata" => {
                        let Some((meta, end)) = value::<ListMeta>(input, at, self.eof)? else {
                            return Ok(Step::Short);
                        };
                        self.resource_version = meta.resource_version;
                        self.continue_token = meta.continue_;
                        end
                    }
                    // `"items": null` is an empty list; anything else is skipped.
                    _ => {
                        let Some((_, end)) = value::<IgnoredAny>(input, at, self.eof)? else {
                            return Ok(Step::Short);
                        };
                        end
                    }
                };
                self.at += end;
                self.expect = Expect::Field { first: false };
                Ok(Step::Read)
            }
            Expect::Item { first } => {
                if byte == b']' {
                    self.at += at + 1;
                    self.expect = Expect::Field { first: false };
                    return Ok(Step::Read);
                }
                if !first {
                    at = after(input, at, b',')?;
                }
                let Some((head, end)) = value::<Head<'_>>(input, at, self.eof)? else {
                    return Ok(Step::Short);
                };
                if end - at > MAX_OBJECT_BYTES {
                    return Err(too_large());
                }
                // Strings serde skipped were not checked as UTF-8.
                let text = std::str::from_utf8(&input[at..end]).map_err(invalid)?;
                let layout = head.layout(text);
                let text = Arc::from(text);
                self.at += end;
                self.expect = Expect::Item { first: false };
                Ok(Step::Object(text, layout))
            }
            Expect::End => Ok(Step::End),
        }
    }
}

/// One JSON value at `at`, and where it ends; `None` if the input ends first. A value that
/// ends the input is taken only at the end of the body (a number could go on).
fn value<'a, T: Deserialize<'a>>(
    input: &'a [u8],
    at: usize,
    eof: bool,
) -> io::Result<Option<(T, usize)>> {
    let mut values = serde_json::Deserializer::from_slice(&input[at..]).into_iter::<T>();
    match values.next() {
        None => Ok(None),
        Some(Ok(v)) => {
            let end = at + values.byte_offset();
            Ok((end < input.len() || eof).then_some((v, end)))
        }
        Some(Err(e)) if e.is_eof() => Ok(None),
        // Valid JSON of another shape than expected.
        Some(Err(e)) if e.is_data() => Err(unreadable_error(e)),
        Some(Err(e)) => Err(invalid(e)),
    }
}

/// Past `punctuation` at `at` and the whitespace after it, or an error if something else is
/// there.
fn after(input: &[u8], at: usize, punctuation: u8) -> io::Result<usize> {
    if input.get(at) == Some(&punctuation) {
        Ok(skip_whitespace(input, at + 1))
    } else {
        Err(invalid(format!(
            "expected {:?} at byte {at} of what was left to read",
            char::from(punctuation)
        )))
    }
}

fn skip_whitespace(input: &[u8], mut at: usize) -> usize {
    while input.get(at).is_some_and(u8::is_ascii_whitespace) {
        at += 1;
    }
    at
}

fn too_large() -> io::Error {
    invalid(format!(
        "an object of the list is larger than {MAX_OBJECT_BYTES} bytes"
    ))
}

fn invalid(message: impl std::fmt::Display) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("reading a list response: {message}"),
    )
}

#[cfg(test)]
mod tests {
    use futures::io::Cursor;
    use kube::{Resource, ResourceExt, api::TypeMeta};
    use serde_json::{Value, json};

    use super::*;

    /// A body that hands out `chunk` bytes at a time.
    struct Chunked {
        data: Vec<u8>,
        at: usize,
        chunk: usize,
    }

    impl futures::AsyncRead for Chunked {
        fn poll_read(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
            out: &mut [u8],
        ) -> std::task::Poll<io::Result<usize>> {
            let this = self.get_mut();
            let n = this.chunk.min(out.len()).min(this.data.len() - this.at);
            out[..n].copy_from_slice(&this.data[this.at..this.at + n]);
            this.at += n;
            std::task::Poll::Ready(Ok(n))
        }
    }

    async fn read_all(text: &[u8], chunk: usize) -> io::Result<(Vec<Value>, Option<String>)> {
        let body = futures::io::BufReader::with_capacity(
            chunk,
            Chunked {
                data: text.to_vec(),
                at: 0,
                chunk,
            },
        );
        let mut reader = ListReader::new(body);
        let mut objects = Vec::new();
        while let Some(object) = reader.next().await? {
            objects.push(serde_json::from_str(object.json().unwrap()).expect("an object's JSON"));
        }
        Ok((objects, reader.resource_version().map(str::to_owned)))
    }

    fn object(name: &str) -> Value {
        json!({
            "metadata": { "name": name, "namespace": "a", "resourceVersion": "3" },
            "data": { "k": "v, \"}]{[\" \\ ü" },
        })
    }

    #[tokio::test]
    async fn objects_come_out_whole_however_the_body_is_cut() {
        let items: Vec<Value> = (0..20).map(|i| object(&format!("o-{i}"))).collect();
        let list = json!({
            "kind": "ConfigMapList", "apiVersion": "v1",
            "metadata": { "resourceVersion": "42" },
            "items": items,
        });
        let text = serde_json::to_string_pretty(&list).expect("JSON");
        for chunk in [1, 2, 7, 64, 4096] {
            let (objects, rv) = read_all(text.as_bytes(), chunk).await.expect("a list");
            assert_eq!(objects, items, "chunks of {chunk} bytes");
            assert_eq!(rv.as_deref(), Some("42"), "chunks of {chunk} bytes");
        }
    }

    #[tokio::test]
    async fn each_object_comes_with_its_routing_fields_and_its_metadata_found() {
        let text = format!(
            r#"{{"metadata":{{"resourceVersion":"9"}},"items":[{},{{"kind":"ConfigMap","metadata":null}}]}}"#,
            object("first")
        );
        let body = futures::io::BufReader::with_capacity(3, Cursor::new(text.into_bytes()));
        let mut reader = ListReader::new(body);
        let first = reader.next().await.expect("read").expect("an object");
        assert_eq!(first.meta().name.as_deref(), Some("first"));
        assert_eq!(first.meta().namespace.as_deref(), Some("a"));
        assert_eq!(first.resource_version().as_deref(), Some("3"));
        let types = TypeMeta {
            api_version: "v1".into(),
            kind: "ConfigMap".into(),
        };
        let metadata: Value =
            serde_json::from_slice(&first.metadata_body(&types).unwrap()).expect("JSON");
        assert_eq!(metadata["metadata"]["name"], "first");
        let full: Value = serde_json::from_slice(&first.full_body(&types).unwrap()).expect("JSON");
        assert_eq!(full["kind"], "ConfigMap");
        assert_eq!(full["data"], object("first")["data"]);
        let second = reader.next().await.expect("read").expect("an object");
        assert_eq!(second.meta().name, None);
        let full: Value = serde_json::from_slice(&second.full_body(&types).unwrap()).expect("JSON");
        assert_eq!(full["apiVersion"], "v1");
        assert!(reader.next().await.expect("read").is_none());
        assert_eq!(reader.resource_version(), Some("9"));
    }

    #[tokio::test]
    async fn fields_in_any_order_and_empty_lists() {
        // Unstructured lists (custom resources) come with their fields sorted: items first.
        let text = format!(
            r#"{{"apiVersion":"x/v1","items":[{}],"kind":"RecordList","metadata":{{"continue":"","resourceVersion":"7"}}}}"#,
            object("r")
        );
        let (objects, rv) = read_all(text.as_bytes(), 3).await.expect("a list");
        assert_eq!(objects, vec![object("r")]);
        assert_eq!(rv.as_deref(), Some("7"));

        for text in [
            r#"{"kind":"L","metadata":{"resourceVersion":"1"},"items":[]}"#,
            r#"{"kind":"L","metadata":{"resourceVersion":"1"},"items":null}"#,
            r#" { "metadata" : { "resourceVersion" : "1" } , "count": 12 } "#,
        ] {
            let (objects, rv) = read_all(text.as_bytes(), 1).await.expect(text);
            assert!(objects.is_empty(), "{text}");
            assert_eq!(rv.as_deref(), Some("1"), "{text}");
        }
    }

    #[tokio::test]
    async fn a_cut_or_malformed_response_is_an_error() {
        let whole = format!(
            r#"{{"metadata":{{"resourceVersion":"1"}},"items":[{},{}]}}"#,
            object("a"),
            object("b")
        );
        for end in [0, 1, 30, whole.len() / 2, whole.len() - 2, whole.len() - 1] {
            let error = read_all(&whole.as_bytes()[..end], 5)
                .await
                .expect_err("cut short");
            assert_eq!(error.kind(), io::ErrorKind::InvalidData, "cut at {end}");
        }
        for text in [
            "[]",
            r#"{"items":[{}] "kind":"L"}"#,
            r#"{"items":[{} {}]}"#,
            r#"{"items" [{}]}"#,
        ] {
            let error = read_all(text.as_bytes(), 4).await.expect_err(text);
            assert_eq!(error.kind(), io::ErrorKind::InvalidData, "{text}");
        }
    }

    #[tokio::test]
    async fn an_object_it_cannot_read_is_told_from_a_response_cut_short() {
        for text in [
            r#"{"items":[{"metadata":7}]}"#,
            r#"{"items":[{"metadata":{"name":3}}]}"#,
            r#"{"items":[17]}"#,
            r#"{"metadata":{"resourceVersion":5},"items":[]}"#,
        ] {
            let error = read_all(text.as_bytes(), 4).await.expect_err(text);
            assert!(unreadable(&error), "{text}: {error}");
        }
        for text in [r#"{"items":[{"metadata":{}"#, r#"{"items":[{} {}]}"#] {
            let error = read_all(text.as_bytes(), 4).await.expect_err(text);
            assert!(!unreadable(&error), "{text}: {error}");
        }
    }

    #[tokio::test]
    async fn an_object_too_large_is_refused_before_it_is_all_held() {
        let big = format!(
            r#"{{"items":[{{"data":"{}"}}]}}"#,
            "x".repeat(MAX_OBJECT_BYTES + 1)
        );
        let body = futures::io::BufReader::new(Cursor::new(big.into_bytes()));
        let mut reader = ListReader::new(body);
        let Err(error) = reader.next().await else {
            panic!("an object over the bound was taken");
        };
        assert!(error.to_string().contains("larger than"), "{error}");
        assert!(reader.buf.len() <= MAX_OBJECT_BYTES + 64 * 1024);
    }
}
