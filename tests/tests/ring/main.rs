//! The ring: membership from Leases, handovers as dispatchers join, leave, stall and die,
//! fencing, and the ring keyed by namespace.

mod fencing;
mod handover;
mod membership;
mod sharding;
