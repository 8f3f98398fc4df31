//! The reconcile-start lines, written to stdout at most once a millisecond.
//!
//! A write per reconcile cost the replica a system call and the harness a wake-up of each task
//! the line passes through: over a cold start of 10 000 quick reconciles on a 2-core machine the
//! harness alone used about 0.12 core-seconds, a tax on every variant that weighs most on the
//! runs bound by CPU. Each line carries the time its reconcile started, so when it reaches the
//! harness changes no time measured from it.

use std::{
    io::Write,
    sync::{Condvar, LazyLock, Mutex, MutexGuard},
    time::Duration,
};

/// How long the writer lets lines gather after the first one before it writes them.
const GATHER: Duration = Duration::from_millis(1);

/// Bytes of lines past which a reconcile writes them itself, waiting as it did when each line
/// was written at once: a harness that reads slowly holds the replica back, not its memory.
const MOST_PENDING: usize = 1 << 20;

/// Lines not written yet: what a millisecond of reconciles prints, about [`MOST_PENDING`] at
/// most (the line that reaches it, and those queued while it is written, wait with it).
struct Pending {
    lines: Mutex<Vec<u8>>,
    /// Signalled when a line arrives in an empty buffer.
    arrived: Condvar,
    /// Held while lines taken from `lines` are written, so they reach stdout in order.
    writing: Mutex<()>,
}

static PENDING: LazyLock<Pending> = LazyLock::new(|| {
    std::thread::Builder::new()
        .name("reconcile-starts".into())
        .spawn(write_forever)
        .expect("cannot start the thread that writes the reconcile-start lines");
    Pending {
        lines: Mutex::new(Vec::new()),
        arrived: Condvar::new(),
        writing: Mutex::new(()),
    }
});

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// Queues `line` (without its newline) for the writer.
pub(super) fn print(line: impl std::fmt::Display) {
    let pending = &*PENDING;
    let mut lines = lock(&pending.lines);
    let was_empty = lines.is_empty();
    let _ = writeln!(lines, "{line}");
    let full = lines.len() >= MOST_PENDING;
    drop(lines);
    if full {
        write_pending(pending);
    } else if was_empty {
        pending.arrived.notify_one();
    }
}

/// Writes every line queued so far, before the process exits.
pub(super) fn flush() {
    write_pending(&PENDING);
}

fn write_forever() {
    let pending = &*PENDING;
    loop {
        let mut lines = lock(&pending.lines);
        while lines.is_empty() {
            lines = pending
                .arrived
                .wait(lines)
                .unwrap_or_else(|e| e.into_inner());
        }
        drop(lines);
        std::thread::sleep(GATHER);
        write_pending(pending);
    }
}

/// Writes the lines queued so far. A closed stdout means the harness is gone; the reconciles
/// still run.
fn write_pending(pending: &Pending) {
    let _writing = lock(&pending.writing);
    let lines = std::mem::take(&mut *lock(&pending.lines));
    if lines.is_empty() {
        return;
    }
    let mut stdout = std::io::stdout().lock();
    let _ = stdout.write_all(&lines).and_then(|()| stdout.flush());
}
