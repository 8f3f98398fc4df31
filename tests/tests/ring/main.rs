//! The ring: membership from Leases, handovers as dispatchers join, leave, stall and die,
//! fencing, lists shared on a ring keyed by name, and the ring keyed by namespace.

mod fencing;
mod handover;
mod lists;
mod membership;
mod sharding;
