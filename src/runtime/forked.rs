//! A forked child of a traced process. Tracing stops in the child at the fork (its parent's
//! writer thread does not exist there), but the child's countdowns keep running in the
//! [`FORKED`] state, so that its sample points (rare: one every [`CHECK_BYTES`] a thread
//! allocates) and its exit look whether the parent that forked it is still there. A child that
//! outlives that parent (a daemon: `daemon(3)`, the grandchild of a double fork) says once, on
//! stderr, that it runs untraced and how to trace it, and stops counting; a child that execs,
//! or exits while its parent lives (`Command::spawn`, a prefork worker), says nothing.
//!
//! Tracing does not follow the child: a trace needs a writer thread and a file, and neither
//! can be made inside the allocator, nor in a fork handler (which may run in a signal
//! handler); the program starts tracing in the child itself, after the fork.

use std::sync::atomic::{AtomicI32, Ordering};

use super::state::{say_without_allocating, FORKED, OFF, STATE};

/// Bytes a thread of a forked child allocates between two looks at its parent.
pub(crate) const CHECK_BYTES: i64 = 256 << 10;

/// The process that forked this one last, while tracing: set in the parent before each fork,
/// inherited by the child.
static PARENT: AtomicI32 = AtomicI32::new(0);

/// Before a fork (in the parent): note who forks.
pub(crate) fn before_fork() {
    // SAFETY: getpid has no preconditions.
    PARENT.store(unsafe { libc::getpid() }, Ordering::Relaxed);
}

/// In the child, just after the fork: tracing stops, and the child watches its parent if
/// tracing was on. One atomic store, async-signal-safe as the child's fork handler must be.
pub(crate) fn after_fork_in_child() {
    if STATE.load(Ordering::Relaxed) != OFF {
        STATE.store(FORKED, Ordering::SeqCst);
    }
}

/// The parent's session ended in this child (stopped or replaced by one of its own): nothing
/// more to watch.
pub(crate) fn forget() {
    let _ = STATE.compare_exchange(FORKED, OFF, Ordering::SeqCst, Ordering::Relaxed);
}

/// Whether this process is a forked child still watching its parent.
#[inline]
pub(crate) fn watching() -> bool {
    STATE.load(Ordering::Relaxed) == FORKED
}

/// In a forked child (at a sample point, or at exit): if the parent that forked it is gone,
/// say so once and stop watching. Allocates nothing and takes no lock (it runs inside the
/// allocator).
pub(crate) fn look_at_parent() {
    if !watching() {
        return;
    }
    let parent = PARENT.load(Ordering::Relaxed);
    // SAFETY: getppid has no preconditions.
    let now = unsafe { libc::getppid() };
    // 0: the parent is in another PID namespace (a child forked into a new one), which says
    // nothing of whether it lives.
    if now == parent || now == 0 {
        return;
    }
    if STATE.compare_exchange(FORKED, OFF, Ordering::SeqCst, Ordering::Relaxed).is_ok() {
        // SAFETY: getpid has no preconditions.
        let pid = unsafe { libc::getpid() };
        say_without_allocating(format_args!(
            "memtrace: process {pid}, forked from the traced process {parent}, outlived it (a daemon?) untraced: \
             tracing stops at a fork; to trace a daemon, start tracing in it after it daemonizes (call \
             trace_if_requested or start_tracing after daemon(3) or the fork)"
        ));
    }
}
