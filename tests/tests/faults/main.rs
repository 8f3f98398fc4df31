//! Restarts and faults: the API server restarted and its watch expired, a dispatcher restarted
//! or cut off, and the seeded chaos suite. The modules other than `apiserver` restart the shared
//! API server or count its requests: `tests/nextest-phases.sh` runs them one at a time.

mod apiserver;
mod apiserver_restart;
mod chaos;
mod dispatcher_restart;
mod fenced_dispatcher;
mod held_keys;
