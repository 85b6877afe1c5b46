//! Tests that must not run beside one another in one test binary.
//!
//! The tests of a binary run on parallel threads. A test that restarts a
//! server it shares with others (a broker node, the replicas of a script),
//! runs a load for seconds, or drives a browser or a fuzzer takes [`heavy`]
//! first: no two such tests then run at once, and their timings do not
//! depend on which others happen to share the machine's cores.

use std::sync::{Mutex, MutexGuard};

static HEAVY: Mutex<()> = Mutex::new(());

/// Held while a heavy test runs; dropping it lets the next one start.
pub struct Heavy(#[allow(dead_code)] MutexGuard<'static, ()>);

/// Waits until no other heavy test of this process runs, and holds the
/// turn until the returned guard is dropped (at the end of the test: bind it
/// to a named variable, `let _heavy = heavy();`). A heavy test that panicked
/// does not stop the next one. Blocking: call it first in a test, before its
/// runtime has work of its own.
pub fn heavy() -> Heavy {
    Heavy(HEAVY.lock().unwrap_or_else(|poisoned| poisoned.into_inner()))
}
