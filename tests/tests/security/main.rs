//! Security and hostile callers: each identity gets what it may read and nothing more, and a
//! shared tier survives every tenant and attacker (`proto/kubedispatch/v1/security.md`).

mod flood;
mod hostile;
mod hostile_tenants;
mod security;
