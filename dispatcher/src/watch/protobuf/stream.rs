//! Lists and watches in protobuf: the requests, a LIST response read an object at a time, and
//! a watch's length-framed events.
//!
//! A LIST response is one envelope (`k8s\0`, then a `runtime.Unknown` whose `raw` is the
//! list): its type comes first, then the list's bytes, whose `metadata` and each of whose
//! `items` are length-prefixed, so [`ListReader`] reads one item at a time and holds at most
//! one (bounded by [`MAX_OBJECT_BYTES`]), as the JSON reader does. A watch response is a
//! series of frames, each a 4-byte big-endian length and a `metav1.WatchEvent` (no envelope),
//! whose object is an envelope in a `runtime.RawExtension`.

use std::{io, sync::Arc};

use futures::{AsyncBufReadExt, AsyncReadExt, Stream, TryStreamExt};
use http_body_util::BodyExt as _;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ListMeta;
use kube::{
    Client,
    api::{TypeMeta, WatchEvent},
    core::{Status, watch::Bookmark},
};
use prost::encoding::WireType;

use super::{
    Encoded, MAGIC, Untranscodable, io_error, json,
    table::{BUILT_IN, Shape, Table},
};
use crate::watch::{
    list_reader::{Body, MAX_OBJECT_BYTES},
    object::WatchedObject,
};

/// What a LIST asks for: protobuf, or JSON where the server has no protobuf for the resource.
pub(crate) const ACCEPT_LIST: &str = "application/vnd.kubernetes.protobuf, application/json";
/// What a WATCH asks for.
const ACCEPT_WATCH: &str = "application/vnd.kubernetes.protobuf;stream=watch";

/// Sends `request` through `client` and returns its body as it arrives. An error status is
/// [`kube::Error::Api`] with the API server's `Status` whatever it was encoded in (kube's own
/// `request_stream` reads only JSON ones, and a protobuf `Status` would lose its code).
pub(crate) async fn send(client: &Client, request: http::Request<Vec<u8>>) -> kube::Result<Body> {
    let response = client.send(request.map(kube::client::Body::from)).await?;
    let code = response.status();
    if code.is_client_error() || code.is_server_error() {
        let bytes = response.into_body().collect_bytes().await?;
        let status = if bytes.starts_with(MAGIC) {
            super::to_json(&bytes)
                .ok()
                .and_then(|text| serde_json::from_str::<Status>(&text).ok())
        } else {
            serde_json::from_slice::<Status>(&bytes).ok()
        };
        // A status without its code (kube's Status reads any JSON object) keeps the HTTP one,
        // so a 410 Gone is always seen as one.
        let status = match status {
            Some(status) if status.code != 0 => status,
            Some(status) => status.with_code(code.as_u16()),
            None => {
                let text = String::from_utf8_lossy(&bytes);
                Status::failure(text.trim(), "Failed to parse error data").with_code(code.as_u16())
            }
        };
        return Err(kube::Error::Api(status.boxed()));
    }
    let body = response
        .into_body()
        .into_data_stream()
        .map_err(io::Error::other)
        .into_async_read();
    Ok(Box::pin(body))
}

/// Reads from a response, counting what it reads.
struct Input {
    body: Body,
    read: u64,
}

impl Input {
    async fn byte(&mut self) -> io::Result<Option<u8>> {
        let buf = self.body.fill_buf().await?;
        let Some(&b) = buf.first() else {
            return Ok(None);
        };
        self.body.as_mut().consume(1);
        self.read += 1;
        Ok(Some(b))
    }

    async fn varint(&mut self) -> io::Result<u64> {
        let first = self.byte().await?.ok_or_else(cut_short)?;
        self.varint_from(first).await
    }

    /// A varint whose first byte, `first`, was read already.
    async fn varint_from(&mut self, first: u8) -> io::Result<u64> {
        let mut value = 0u64;
        let mut b = first;
        for shift in (0..64).step_by(7) {
            if shift > 0 {
                b = self.byte().await?.ok_or_else(cut_short)?;
            }
            // The tenth byte holds the 64th bit only.
            if shift == 63 && b > 1 {
                break;
            }
            value |= u64::from(b & 0x7f) << shift;
            if b < 0x80 {
                return Ok(value);
            }
        }
        Err(io_error(Untranscodable::Unexpected(
            "a varint past 64 bits".into(),
        )))
    }

    /// A field's key; `None` where the response ends before one.
    async fn key(&mut self) -> io::Result<Option<(u32, WireType)>> {
        let Some(first) = self.byte().await? else {
            return Ok(None);
        };
        // A key is a varint of at most 32 bits: the field's number (from 1), then 3 bits of
        // wire type.
        let key = self.varint_from(first).await?;
        match (u32::try_from(key), WireType::try_from(key & 0x07)) {
            (Ok(key @ 8..), Ok(wire_type)) => Ok(Some((key >> 3, wire_type))),
            _ => Err(unexpected(format!("a field key of {key}"))),
        }
    }

    /// A length-delimited value of at most `limit` bytes.
    async fn delimited(&mut self, limit: usize) -> io::Result<Vec<u8>> {
        let len = self.varint().await?;
        let len = usize::try_from(len)
            .ok()
            .filter(|&l| l <= limit)
            .ok_or_else(|| {
                io_error(Untranscodable::Bound(format!(
                    "a value of {len} bytes, over the {limit} a dispatcher reads"
                )))
            })?;
        let mut value = vec![0; len];
        self.body.read_exact(&mut value).await?;
        self.read += len as u64;
        Ok(value)
    }
}

fn cut_short() -> io::Error {
    io::Error::new(io::ErrorKind::UnexpectedEof, "the response ended part-way")
}

fn unexpected(what: impl std::fmt::Display) -> io::Error {
    io_error(Untranscodable::Unexpected(what.to_string()))
}

/// The parts of a list type: its metadata's type and its items'.
fn list_parts(table: &Table, ty: u32) -> Option<(u32, u32)> {
    let fields = &table.types[ty as usize].fields;
    let of = |name: &str| fields.iter().find(|f| f.name.as_deref() == Some(name));
    match (&of("metadata")?.shape, &of("items")?.shape) {
        (Shape::Message(meta), Shape::List(item)) => match **item {
            Shape::Message(item) => Some((*meta, item)),
            _ => None,
        },
        _ => None,
    }
}

/// Where a [`ListReader`] is in its response.
enum At {
    /// Before the envelope.
    Start,
    /// In the list: this many bytes of it are left, its metadata and items of these types.
    List { end: u64, meta: u32, item: u32 },
    /// After the list.
    Done,
}

/// A LIST response in protobuf, read an object at a time (see the module docs).
pub(crate) struct ListReader {
    input: Input,
    at: At,
    resource_version: Option<String>,
    continue_token: Option<String>,
    /// The type of the items, written first in each one's JSON, if known.
    types: Option<Arc<TypeMeta>>,
}

impl ListReader {
    /// A reader of the list response `body`, whose items are of `types` if known.
    pub(crate) fn new(body: Body, types: Option<Arc<TypeMeta>>) -> Self {
        Self {
            types,
            input: Input { body, read: 0 },
            at: At::Start,
            resource_version: None,
            continue_token: None,
        }
    }

    /// The list's resourceVersion, once [`Self::next`] has returned `None`.
    pub(crate) fn resource_version(&self) -> Option<&str> {
        self.resource_version.as_deref()
    }

    /// Where the list goes on, if it was a page: once [`Self::next`] has returned `None`.
    pub(crate) fn continue_token(&self) -> Option<&str> {
        self.continue_token.as_deref().filter(|t| !t.is_empty())
    }

    /// The next object, or `None` when the list has ended. An error is final: the response
    /// was cut short or holds what the table cannot read ([`Untranscodable`] in the error). An
    /// object is read as far as its routing fields; what the table cannot read in the rest of
    /// it is found when its JSON is written ([`WatchedObject::transcoded`]).
    pub(crate) async fn next(&mut self) -> io::Result<Option<WatchedObject>> {
        // Counted against the task's budget, as the JSON reader's objects are.
        tokio::task::coop::consume_budget().await;
        let table = &*BUILT_IN;
        loop {
            match self.at {
                At::Start => self.start(table).await?,
                At::List { end, meta, item } => {
                    if self.input.read >= end {
                        self.at = At::Done;
                        continue;
                    }
                    match self.input.key().await?.ok_or_else(cut_short)? {
                        (1, WireType::LengthDelimited) => {
                            let bytes = self.input.delimited(MAX_OBJECT_BYTES).await?;
                            let (text, _) =
                                json::object(table, meta, &bytes, None).map_err(io_error)?;
                            let list_meta: ListMeta =
                                serde_json::from_str(&text).map_err(unexpected)?;
                            self.resource_version = list_meta.resource_version;
                            self.continue_token = list_meta.continue_;
                        }
                        (2, WireType::LengthDelimited) => {
                            let bytes = self.input.delimited(MAX_OBJECT_BYTES).await?;
                            let types = self.types.clone();
                            let typed = types.is_some();
                            let (meta, encoded) = Encoded::read(table, item, bytes.into(), types)
                                .map_err(io_error)?;
                            return Ok(Some(WatchedObject::from_protobuf(meta, encoded, typed)));
                        }
                        (number, _) => return Err(unexpected(format!("list field {number}"))),
                    }
                }
                At::Done => {
                    // The envelope's content type and encoding, empty, may follow.
                    return match self.input.key().await? {
                        None => Ok(None),
                        Some((3 | 4, WireType::LengthDelimited)) => {
                            self.input.delimited(1024).await?;
                            continue;
                        }
                        Some((number, _)) => Err(unexpected(format!(
                            "envelope field {number} after the list"
                        ))),
                    };
                }
            }
        }
    }

    /// Reads the envelope up to the list's first field.
    async fn start(&mut self, table: &Table) -> io::Result<()> {
        let mut magic = [0; 4];
        self.input.body.read_exact(&mut magic).await?;
        self.input.read += 4;
        if &magic != MAGIC {
            return Err(unexpected("a list response without the protobuf magic"));
        }
        let mut parts = None;
        loop {
            match self.input.key().await?.ok_or_else(cut_short)? {
                (1, WireType::LengthDelimited) => {
                    let types = self.input.delimited(4096).await?;
                    let (api_version, kind) = super::type_meta(&types).map_err(io_error)?;
                    let ty = super::kind_type(table, api_version, kind).map_err(io_error)?;
                    parts = Some(
                        list_parts(table, ty)
                            .ok_or_else(|| unexpected(format!("{kind} is not a list")))?,
                    );
                }
                (2, WireType::LengthDelimited) => {
                    let (meta, item) = parts.ok_or_else(|| unexpected("a list before its type"))?;
                    let len = self.input.varint().await?;
                    let end = self.input.read.checked_add(len);
                    let end = end.ok_or_else(|| unexpected("a list longer than 2^64 bytes"))?;
                    self.at = At::List { end, meta, item };
                    return Ok(());
                }
                (number, _) => return Err(unexpected(format!("envelope field {number}"))),
            }
        }
    }
}

/// The events of a watch response in protobuf (see the module docs), as kube's JSON watch
/// gives them; objects of the watch's type `types` share it.
pub(crate) fn events(
    body: Body,
    types: Option<Arc<TypeMeta>>,
) -> impl Stream<Item = kube::Result<WatchEvent<WatchedObject>>> + Send {
    futures::stream::unfold(Some(body), move |body| {
        let types = types.clone();
        async move {
            let mut body = body?;
            let event = frame(&mut body, types.as_ref()).await;
            match event {
                Ok(None) => None,
                Ok(Some(event)) => Some((Ok(event), Some(body))),
                // Nothing is read past a broken frame.
                Err(e) => Some((Err(kube::Error::ReadEvents(e)), None)),
            }
        }
    })
}

/// Starts the watch `request` (made for JSON by kube) in protobuf through `client`, of
/// objects of `types`.
pub(crate) async fn watch(
    client: &Client,
    mut request: http::Request<Vec<u8>>,
    types: Arc<TypeMeta>,
) -> kube::Result<impl Stream<Item = kube::Result<WatchEvent<WatchedObject>>> + Send + use<>> {
    request.headers_mut().insert(
        http::header::ACCEPT,
        http::HeaderValue::from_static(ACCEPT_WATCH),
    );
    Ok(events(send(client, request).await?, Some(types)))
}

/// The next event of a watch, its object sharing `types` if of that type; `None` where the
/// response ends between two.
async fn frame(
    body: &mut Body,
    types: Option<&Arc<TypeMeta>>,
) -> io::Result<Option<WatchEvent<WatchedObject>>> {
    let mut len = [0; 4];
    match body.read(&mut len[..1]).await? {
        0 => return Ok(None),
        _ => body.read_exact(&mut len[1..]).await?,
    }
    let len = u32::from_be_bytes(len) as usize;
    if len > MAX_OBJECT_BYTES {
        let error =
            format!("a watch event of {len} bytes, over the {MAX_OBJECT_BYTES} a dispatcher reads");
        return Err(io_error(Untranscodable::Bound(error)));
    }
    let mut bytes = vec![0; len];
    body.read_exact(&mut bytes).await?;
    let bytes = bytes::Bytes::from(bytes);
    let table = &*BUILT_IN;
    let (mut kind, mut object) = (None, None);
    for (number, value) in super::fields(&bytes).map_err(io_error)? {
        match number {
            1 => kind = Some(std::str::from_utf8(value).map_err(unexpected)?),
            2 => {
                let raw = super::fields(value).map_err(io_error)?;
                object = raw.into_iter().rev().find(|(n, _)| *n == 1).map(|(_, v)| v);
            }
            _ => return Err(unexpected(format!("watch event field {number}"))),
        }
    }
    let object = object.ok_or_else(|| unexpected("a watch event without its object"))?;
    let read = || super::object(table, &bytes.slice_ref(object), types).map_err(io_error);
    let event = match kind.unwrap_or_default() {
        "ADDED" => WatchEvent::Added(read()?),
        "MODIFIED" => WatchEvent::Modified(read()?),
        "DELETED" => WatchEvent::Deleted(read()?),
        "BOOKMARK" => {
            let text = super::to_json(object).map_err(io_error)?;
            WatchEvent::Bookmark(serde_json::from_str::<Bookmark>(&text).map_err(unexpected)?)
        }
        "ERROR" => {
            let text = super::to_json(object).map_err(io_error)?;
            WatchEvent::Error(
                serde_json::from_str::<Status>(&text)
                    .map_err(unexpected)?
                    .boxed(),
            )
        }
        other => return Err(unexpected(format!("a watch event of type {other:?}"))),
    };
    Ok(Some(event))
}

#[cfg(test)]
mod tests;
