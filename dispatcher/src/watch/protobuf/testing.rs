//! Protobuf messages built by hand, for the tests of this module.

use prost::encoding::{WireType, encode_key, encode_varint};

use super::table::BUILT_IN;

/// A protobuf message built field by field.
#[derive(Clone, Default)]
pub(crate) struct Msg(pub Vec<u8>);

impl Msg {
    pub(crate) fn bytes(mut self, number: u32, value: &[u8]) -> Self {
        encode_key(number, WireType::LengthDelimited, &mut self.0);
        encode_varint(value.len() as u64, &mut self.0);
        self.0.extend_from_slice(value);
        self
    }
    pub(crate) fn str(self, number: u32, value: &str) -> Self {
        self.bytes(number, value.as_bytes())
    }
    pub(crate) fn msg(self, number: u32, value: Msg) -> Self {
        self.bytes(number, &value.0)
    }
    pub(crate) fn varint(mut self, number: u32, value: u64) -> Self {
        encode_key(number, WireType::Varint, &mut self.0);
        encode_varint(value, &mut self.0);
        self
    }
}

/// The protobuf number of the field JSON calls `name` in the type `ty` ("apps/v1.Deployment").
pub(crate) fn number(ty: &str, name: &str) -> u32 {
    let t = BUILT_IN
        .types
        .iter()
        .find(|t| t.name.ends_with(&format!("/{ty}")))
        .unwrap_or_else(|| panic!("no type {ty}"));
    t.fields
        .iter()
        .find(|f| f.name.as_deref() == Some(name))
        .unwrap_or_else(|| panic!("no field {name} in {ty}"))
        .number
}

/// An envelope (`k8s\0` and a `runtime.Unknown`) of `raw`, an object of `kind`.
pub(crate) fn envelope(api_version: &str, kind: &str, raw: &Msg) -> Vec<u8> {
    let types = Msg::default().str(1, api_version).str(2, kind);
    let mut bytes = super::MAGIC.to_vec();
    bytes.extend_from_slice(&Msg::default().msg(1, types).bytes(2, &raw.0).0);
    bytes
}

/// A ConfigMap named `name` at `version`, with `data`.
pub(crate) fn config_map(name: &str, version: &str, data: &str) -> Msg {
    let meta = Msg::default()
        .str(1, name)
        .str(3, "ns")
        .str(5, "uid-1")
        .str(6, version);
    Msg::default()
        .msg(1, meta)
        .msg(2, Msg::default().str(1, "k").str(2, data))
}

/// A ConfigMapList of `items` at resourceVersion 7, continued by `token`.
pub(crate) fn list(items: &[Msg], token: &str) -> Vec<u8> {
    let mut list = Msg::default().msg(1, Msg::default().str(2, "7").str(3, token));
    for item in items {
        list = list.msg(2, item.clone());
    }
    envelope("v1", "ConfigMapList", &list)
}
