//! Contract edges a controller author meets (keys.md, "What a subscription delivers"), against
//! the real API server: an object that leaves a subscription's selector is delivered as gone and,
//! back in it, as added; a name deleted and created again before the next poll is delivered as
//! the old object's deletion, then the new object, one at a time; a grandchild's change does not
//! reach the top of an ownership chain (one level, like controller-runtime's `Owns`); an owner
//! that loses a child to another owner, or to none, hears of it; keys in flight on a session a
//! client closes or replaces without acknowledging wait for its fence; a controller back after
//! the idle grace starts from what exists; a change to an object others name at a field path
//! reconciles exactly those that name it now; a cluster-scoped owner of namespaced children is
//! delivered under its own key.

mod support;

mod keys;
mod owners;
mod related;
