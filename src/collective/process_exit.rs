//! What a process's `exit()` does to the collective kernels it leaves behind: raises the abort word of
//! every communicator still alive, so that a kernel waiting for a peer ends instead of spinning.
//!
//! Why: a process that calls `exit()` (or returns from `main`) with a collective still waiting in its
//! stream — after a peer died, or in the middle of a call its peers have not joined — hands its context to
//! the CUDA runtime's and driver's teardown, which waits for the kernels that are running. Without MPS the
//! driver preempts them; under MPS, where the ranks' kernels run side by side, the teardown waits for them
//! to end, and a kernel waiting for data that will never come never would: the process hung in `exit()`.
//! Kernels poll the abort word while they wait, so raising it ends them within microseconds. A fatal
//! signal runs no atexit handler; there the driver alone ends the process (docs/failures.md, "A process that ends").

use super::abort_word::AbortWord;
use parking_lot::Mutex;
use std::sync::{Arc, Once, Weak};

static LIVE: Mutex<Vec<Weak<AbortWord>>> = Mutex::new(Vec::new());
static REGISTER: Once = Once::new();

/// Raises `word` when the process exits, if it is still alive then. The handler is registered at the
/// first collectives' set-up, after the CUDA runtime's own (atexit handlers run in reverse order), so it
/// runs before the runtime tears the contexts down.
pub fn raise_at_exit(word: &Arc<AbortWord>) {
    let mut live = LIVE.lock();
    live.retain(|w| w.strong_count() > 0);
    live.push(Arc::downgrade(word));
    drop(live);
    REGISTER.call_once(|| {
        // SAFETY: registers a plain `extern "C" fn()` that takes no arguments and never unwinds.
        if unsafe { libc::atexit(raise_all) } != 0 {
            log::warn!("atexit refused the collectives' exit handler: a process that exits with a collective in flight may wait for it");
        }
    });
}

extern "C" fn raise_all() {
    // `try_lock`: an exit from inside a set-up (another thread holding the lock) must not deadlock here.
    let Some(live) = LIVE.try_lock() else { return };
    let mut raised = 0;
    for word in live.iter().filter_map(Weak::upgrade) {
        word.raise();
        raised += 1;
    }
    if raised > 0 {
        log::info!("process exit: raised the abort word of {raised} communicator(s) so that their kernels end");
    }
}
