//! Which objects the fan-out writes as JSON: only those whose JSON publishing reads. An object
//! the API server sent in protobuf keeps its protobuf bytes (`crate::watch::protobuf::Encoded`);
//! one placed elsewhere on the ring and owned by none served here needs its routing fields only,
//! so two thirds of the objects a dispatcher of a ring of three reads are never written.

use kube_dispatch_core::key::KeyRef;
use tracing::warn;

use super::{FanOut, Keyed, Subscriber, describe};
use crate::watch::{
    object::WatchedObject,
    protobuf::Untranscodable,
    routing::{Place, owner_key},
};

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
        if !self.needs_json(subscribers, obj, place, deleted) {
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
    /// group that serves its key here, or its body, for the index of the children of an owner
    /// this dispatcher may serve.
    fn needs_json(
        &self,
        subscribers: &[Subscriber],
        obj: &WatchedObject,
        place: Place,
        deleted: bool,
    ) -> bool {
        subscribers.iter().any(|sub| match sub.keyed() {
            Keyed::Itself => place == Place::Here,
            Keyed::Owner(kind) => {
                !deleted
                    && owner_key(obj, kind)
                        .is_some_and(|k| self.indexes_children_of(KeyRef::new(&k.to_string())))
            }
            Keyed::Referrers => false,
        })
    }
}
