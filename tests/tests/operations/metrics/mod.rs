//! The replica's metrics against the real API server: controller-runtime's names, types and
//! labels, counters that move with what reconciles do, and the admin endpoint that serves
//! them with the probes.

mod support;

mod alerts;

mod own_writes;
mod reads;
mod replica;
mod tier;
