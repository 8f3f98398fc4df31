//! What each [`Action`](super::Action) does to the state: one method per action, called by
//! `next_state`, by the part of the system it moves.

mod clock;
mod dispatchers;
mod objects;
mod sessions;
