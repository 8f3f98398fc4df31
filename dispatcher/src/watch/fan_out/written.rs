//! What the fan-out reads of an object beyond its routing fields ([`Content`]), and which
//! objects it writes as JSON for it: only those whose JSON publishing reads. An object
//! the API server sent in protobuf keeps its protobuf bytes (`crate::watch::protobuf::Encoded`);
//! one placed elsewhere on the ring and owned by none served here needs its routing fields only,
//! so two thirds of the objects a dispatcher of a ring of three reads in its watch's list and
//! stream are never written (a list beside the stream writes every object it reads).

use std::{num::NonZeroU64, sync::Arc};

use kube_dispatch_core::{key::KeyRef, subscription::Payload};
use tracing::warn;

use super::{FanOut, Keyed, Subscriber, describe};
use crate::watch::{
    object::WatchedObject,
    protobuf::Untranscodable,
    routing::{Bodies, Place, owner_key},
};

/// What a primary subscription's event carries of an object beyond its key and version.
#[derive(Default)]
pub(super) struct Content {
    pub(super) body: Option<Arc<[u8]>>,
    pub(super) trace: Option<Arc<str>>,
    pub(super) fingerprint: Option<NonZeroU64>,
}

impl Content {
    /// What `sub` is told of `obj`: its body (from `bodies`), `trace`, and its change filter's
    /// hash.
    pub(super) fn of(
        sub: &Subscriber,
        obj: &WatchedObject,
        bodies: &mut Bodies<'_>,
        trace: Option<Arc<str>>,
    ) -> Self {
        Self {
            body: bodies.get(sub.payload, obj),
            trace,
            fingerprint: obj.fingerprint(sub.changes_of),
        }
    }
}

impl FanOut {
    /// Writes the JSON of `obj` (key `key`, placed at `place`, `deleted` or not) now if
    /// publishing it reads it: what the table of types cannot read in it is an error before
    /// anything is published, as if reading it had failed, not a body left out later.
    pub(super) fn write_json(
        &self,
        subscribers: &[Subscriber],
        obj: &WatchedObject,
        (place, deleted): (Place, bool),
        key: &str,
    ) -> Result<(), Untranscodable> {
        if !self.reads_json(subscribers, obj, place, deleted) {
            return Ok(());
        }
        match obj.transcoded() {
            Ok(()) => Ok(()),
            // JSON would meet the bound too: delivered without a body, its replica reads it.
            Err(Untranscodable::Bound(e)) => {
                warn!(resource = %describe(&self.key), key, error = %e, "the object's JSON is past a bound of the dispatcher's: delivered without its body");
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// Whether publishing `obj` reads its JSON: its body, change filter or references, for a
    /// group that serves its key here and asks for one of them, or its body, for an index of
    /// children that keeps bodies and the children of an owner this dispatcher may serve. It
    /// may say yes where nothing reads it, but never no where something does: that would hand
    /// an object the table cannot write on without its body, instead of turning the watch to
    /// JSON.
    fn reads_json(
        &self,
        subscribers: &[Subscriber],
        obj: &WatchedObject,
        place: Place,
        deleted: bool,
    ) -> bool {
        subscribers.iter().any(|sub| match sub.keyed() {
            Keyed::Itself => {
                place == Place::Here
                    && (sub.payload != Payload::KeyOnly
                        || !sub.changes_of.is_empty()
                        || sub
                            .group
                            .spec
                            .named_from(&self.key.resource)
                            .next()
                            .is_some())
            }
            Keyed::Owner(kind) => {
                !deleted
                    && self.children.keeps_bodies()
                    && owner_key(obj, kind)
                        .is_some_and(|k| self.indexes_children_of(KeyRef::new(&k.to_string())))
            }
            Keyed::Referrers => false,
        })
    }
}
