//! The tracer's own threads (the writer, the symbolizer), the doorbell that wakes one, and
//! the growth of their malloc arenas ahead of their work.
//!
//! A tracer thread is started with `pthread_create` itself rather than `std::thread`, so that
//! nothing runs on it before it is marked a tracer thread ([`sampler::enter_tracer_forever`]):
//! std's start of a thread allocates (its spawn hooks' thread-local), and with a session
//! running the sampler could take that allocation for the program's. Its closure's result (or
//! panic) is handed over through a shared slot, so that a thread never joined drops it as it
//! ends.
//!
//! Every tracer thread starts with the program's asynchronous signals blocked
//! ([`with_async_signals_blocked`]).
//!
//! The writer is started off the CPU of the thread that starts tracing, when it may run
//! elsewhere ([`Steering`]), and then let run anywhere its starter may; the symbolizer's
//! thread, whose starter (the writer) mostly waits for it, is started as the scheduler likes.

use std::sync::atomic::{fence, AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use parking_lot::Mutex;

use super::sampler;

/// A tracer thread's stack: std's default for its threads.
pub(crate) const STACK_SIZE: usize = 2 << 20;

/// A running tracer thread, detached when dropped unjoined.
pub(crate) struct TracerThread<T> {
    thread: libc::pthread_t,
    result: ResultSlot<T>,
}

/// Where a tracer thread puts its closure's result, or its panic.
type ResultSlot<T> = Arc<Mutex<Option<std::thread::Result<T>>>>;

/// What the new thread is given: its name, its closure, where to put the result, and the
/// CPUs it may run on once started, if it was started on fewer ([`Steering`]).
type Start<T> = (&'static std::ffi::CStr, Box<dyn FnOnce() -> T + Send>, ResultSlot<T>, Option<libc::cpu_set_t>);

impl<T: Send + 'static> TracerThread<T> {
    /// Start `f` on a new tracer thread named `name` (at most 15 bytes, as the kernel keeps).
    pub(crate) fn spawn(
        name: &'static std::ffi::CStr,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> std::io::Result<Self> {
        Self::spawn_steered(name, f, None)
    }

    /// [`TracerThread::spawn`], the thread started off the CPU the caller is on when it may
    /// run elsewhere ([`Steering`]): for a thread meant to run beside its starter at once.
    pub(crate) fn spawn_beside(
        name: &'static std::ffi::CStr,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> std::io::Result<Self> {
        Self::spawn_steered(name, f, Steering::from_here())
    }

    /// [`TracerThread::spawn`], the thread started where `steering` says.
    fn spawn_steered(
        name: &'static std::ffi::CStr,
        f: impl FnOnce() -> T + Send + 'static,
        steering: Option<Steering>,
    ) -> std::io::Result<Self> {
        extern "C" fn run<T>(start: *mut libc::c_void) -> *mut libc::c_void {
            sampler::enter_tracer_forever();
            // SAFETY: `start` is the box `spawn` leaked for this thread, taken back once, here.
            let (name, f, result, allowed) = *unsafe { Box::from_raw(start as *mut Start<T>) };
            if let Some(allowed) = allowed {
                // Where it runs from now on is the scheduler's choice, among the CPUs its
                // starter may use. Should this fail (a cpuset changed meanwhile), the thread
                // keeps off its starter's CPU, and so do the threads it starts: on two CPUs,
                // they all run on the other one.
                set_cpus_of_this_thread(&allowed);
            }
            // Named by itself (a `prctl`): naming another thread writes its file in `/proc`,
            // three system calls more on the thread that starts tracing. `name` is
            // NUL-terminated; the kernel keeps 15 bytes of a name, and refuses a longer one.
            // SAFETY: this thread is live.
            unsafe { libc::pthread_setname_np(libc::pthread_self(), name.as_ptr()) };
            let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
            *result.lock() = Some(outcome);
            std::ptr::null_mut()
        }
        let result = Arc::new(Mutex::new(None));
        let start: Box<Start<T>> =
            Box::new((name, Box::new(f), Arc::clone(&result), steering.as_ref().map(|s| s.allowed)));
        let start = Box::into_raw(start) as *mut libc::c_void;
        let mut thread = 0;
        // SAFETY: `attributes` is initialised before it is used and destroyed after; `run::<T>`
        // takes `start` back.
        let create = |elsewhere: Option<&libc::cpu_set_t>, thread: &mut libc::pthread_t| unsafe {
            let mut attributes = std::mem::MaybeUninit::<libc::pthread_attr_t>::uninit();
            libc::pthread_attr_init(attributes.as_mut_ptr());
            // The stack std gives its threads, whatever `ulimit -s` says (glibc's default).
            libc::pthread_attr_setstacksize(attributes.as_mut_ptr(), STACK_SIZE.max(libc::PTHREAD_STACK_MIN));
            // glibc's alone ([`Steering::from_here`] gives none elsewhere).
            #[cfg(target_env = "gnu")]
            if let Some(elsewhere) = elsewhere {
                libc::pthread_attr_setaffinity_np(
                    attributes.as_mut_ptr(),
                    std::mem::size_of::<libc::cpu_set_t>(),
                    elsewhere,
                );
            }
            #[cfg(not(target_env = "gnu"))]
            let _ = elsewhere;
            let error = libc::pthread_create(thread, attributes.as_ptr(), run::<T>, start);
            libc::pthread_attr_destroy(attributes.as_mut_ptr());
            error
        };
        let error = with_async_signals_blocked(|| {
            let error = create(steering.as_ref().map(|s| &s.elsewhere), &mut thread);
            if error != 0 && steering.is_some() {
                // glibc fails the whole creation when it cannot set the new thread's CPUs (a
                // sandbox that forbids it, a cpuset changed meanwhile): start it without.
                return create(None, &mut thread);
            }
            error
        });
        if error != 0 {
            // SAFETY: the thread was not created: the box is still ours.
            drop(unsafe { Box::from_raw(start as *mut Start<T>) });
            return Err(std::io::Error::from_raw_os_error(error));
        }
        Ok(TracerThread { thread, result })
    }

    /// Whether the thread's closure has returned (or panicked).
    pub(crate) fn is_finished(&self) -> bool {
        self.result.lock().is_some()
    }

    /// Wait for the thread to end: its closure's result, or its panic.
    pub(crate) fn join(self) -> std::thread::Result<T> {
        let (thread, result) = self.into_parts();
        // SAFETY: joined once: `into_parts` consumed the handle without detaching it.
        unsafe { libc::pthread_join(thread, std::ptr::null_mut()) };
        let outcome = result.lock().take();
        outcome.unwrap_or_else(|| Err(Box::new("the tracer thread ended without a result")))
    }

    /// Forget the thread without detaching it: in a forked child, where it does not exist.
    pub(crate) fn forget(self) {
        drop(self.into_parts());
    }

    /// The thread and its result slot, the handle consumed without its `Drop`, which detaches.
    fn into_parts(self) -> (libc::pthread_t, ResultSlot<T>) {
        let this = std::mem::ManuallyDrop::new(self);
        // SAFETY: `result` is read out of the `ManuallyDrop` once, and `this` is not used after.
        (this.thread, unsafe { std::ptr::read(&this.result) })
    }
}

impl<T> Drop for TracerThread<T> {
    fn drop(&mut self) {
        // SAFETY: a live thread never joined: it cleans up after itself as it ends.
        unsafe { libc::pthread_detach(self.thread) };
    }
}

/// Run `f` with every asynchronous signal blocked on the calling thread, its signal mask
/// restored after: a thread started in `f` begins with them blocked, before any of its code
/// runs, and keeps them so. The program's signals are the program's: a signal sent to the
/// process (a SIGTERM that a program waits for with `sigwait` or a `signalfd`, with every
/// thread of its own blocking it) is never taken by a tracer thread, whose default action
/// would end the process; nor are SIGPIPE and SIGXFSZ, which the writer's writes raise on a
/// reader gone or past the file size limit: its write fails instead (EPIPE, EFBIG), and the
/// trace stops with one message. The signals of faults (SIGSEGV, SIGBUS, SIGFPE, SIGILL,
/// SIGTRAP, SIGSYS) stay unblocked: the kernel would end the process for a fault of a thread
/// blocking them without calling the program's handler. (glibc keeps its own signals, of
/// thread cancellation and `setuid`, unblocked whatever is asked.)
pub(crate) fn with_async_signals_blocked<R>(f: impl FnOnce() -> R) -> R {
    // SAFETY: the sets are initialised by sigfillset/sigemptyset before use; pthread_sigmask
    // changes the calling thread's mask only, restored below.
    unsafe {
        let mut blocked = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
        libc::sigfillset(blocked.as_mut_ptr());
        for fault in [libc::SIGSEGV, libc::SIGBUS, libc::SIGFPE, libc::SIGILL, libc::SIGTRAP, libc::SIGSYS] {
            libc::sigdelset(blocked.as_mut_ptr(), fault);
        }
        let mut before = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
        libc::sigemptyset(before.as_mut_ptr());
        libc::pthread_sigmask(libc::SIG_BLOCK, blocked.as_ptr(), before.as_mut_ptr());
        let result = f();
        libc::pthread_sigmask(libc::SIG_SETMASK, before.as_ptr(), std::ptr::null_mut());
        result
    }
}

/// Where a new tracer thread starts: on a CPU its starter may run on other than the one the
/// starter is running on, when there is one.
///
/// The kernel may queue a new thread on its starter's CPU, and leave it there, unrun, while
/// the starter keeps that CPU busy and another sits idle: on a 2-CPU virtual machine
/// (Linux 6.18), a writer started by a short program's `trace_if_requested` mostly started on
/// the program's CPU and ran only once the program stopped and waited for it, so that it named
/// the program's first sample during the stop rather than while the program ran. Started
/// elsewhere, it ran at once (README.md at cfd4150, "Benchmarks", has the counts).
struct Steering {
    /// The CPUs the starter may run on: the thread's own once started.
    allowed: libc::cpu_set_t,
    /// Those without the starter's current one: the thread's to start on.
    elsewhere: libc::cpu_set_t,
}

impl Steering {
    /// The calling thread's CPUs and the one it is on; `None` when it may only run on that one
    /// (or the system says nothing: more CPUs than a `cpu_set_t` holds, say).
    fn from_here() -> Option<Steering> {
        // Set at the thread's creation, with a glibc extension.
        if !cfg!(target_env = "gnu") {
            return None;
        }
        let allowed = cpus_of_this_thread()?;
        // SAFETY: the CPU numbers tested are below the size of a set.
        unsafe {
            let here = usize::try_from(libc::sched_getcpu()).ok()?;
            if here >= libc::CPU_SETSIZE as usize || !libc::CPU_ISSET(here, &allowed) || libc::CPU_COUNT(&allowed) < 2 {
                return None;
            }
            let mut elsewhere = allowed;
            libc::CPU_CLR(here, &mut elsewhere);
            Some(Steering { allowed, elsewhere })
        }
    }
}

/// Whether the calling thread may run on more than one CPU (when the system says).
pub(crate) fn may_run_elsewhere() -> bool {
    // SAFETY: counts the CPUs of a set filled in by the system.
    cpus_of_this_thread().is_some_and(|cpus| unsafe { libc::CPU_COUNT(&cpus) } > 1)
}

/// The calling thread's CPUs (its affinity mask); `None` when the system does not say (more
/// CPUs than a `cpu_set_t` holds, say).
fn cpus_of_this_thread() -> Option<libc::cpu_set_t> {
    // SAFETY: a zeroed `cpu_set_t` is an empty set, filled in by the call, of the size given.
    unsafe {
        let mut cpus: libc::cpu_set_t = std::mem::zeroed();
        (libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut cpus) == 0).then_some(cpus)
    }
}

/// Let the calling thread run on `cpus`; false when the system refuses.
fn set_cpus_of_this_thread(cpus: &libc::cpu_set_t) -> bool {
    // SAFETY: a set of the size given.
    unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), cpus) == 0 }
}

/// The address space a tracer thread's malloc arena reserves, if the thread gets one of its
/// own: glibc's `HEAP_MAX_SIZE` on 64-bit systems (mapped with no access, then made accessible
/// as the arena grows).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub(crate) const ARENA_ADDRESS_SPACE: usize = 64 << 20;
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub(crate) const ARENA_ADDRESS_SPACE: usize = 0;

/// Blocks [`grow_arena`] allocates: just below glibc's default threshold for serving a block
/// by `mmap` (128 KiB), so that each comes from the thread's arena.
const ARENA_BLOCK: usize = 120 << 10;
const ARENA_BLOCKS: usize = 4;

/// Grow the calling thread's malloc arena by about half a MiB at once, before work that
/// allocates much of that (naming frames). glibc grows the arena of a thread other than the
/// first a page at a time as it fills, with an `mprotect` for each page: tens of them for a
/// short program's first sample (README.md at cfd4150, "Benchmarks"). Blocks allocated and freed again grow
/// it in a few calls; when glibc then trims the free space it keeps the pages accessible, so
/// that refilling them takes no more calls.
pub(crate) fn grow_arena() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        use std::alloc::{alloc, dealloc, Layout};
        // Through the global allocator, so that an inner allocator other than glibc's is
        // left to itself (at worst a few wasted calls), not given a glibc arena it never uses.
        // The first allocation of a thread makes its arena: the blocks come from that.
        let first = Layout::new::<u64>();
        let block = Layout::from_size_align(ARENA_BLOCK, 16).expect("a valid layout");
        // SAFETY: blocks of our own with these layouts, never used, each freed once if it was
        // allocated; `black_box` keeps the compiler from eliding the pairs.
        unsafe {
            let one = std::hint::black_box(alloc(first));
            if !one.is_null() {
                dealloc(one, first);
            }
            let blocks = [(); ARENA_BLOCKS].map(|()| std::hint::black_box(alloc(block)));
            for grown in blocks.into_iter().filter(|b| !b.is_null()) {
                dealloc(grown, block);
            }
        }
    }
}

/// A wake-up for a tracer thread that sleeps between rounds of work: a ring before the wait
/// ends the wait at once. It parks the thread (`std::thread::park_timeout`, a futex of the
/// thread's own) rather than wait on a `parking_lot` condition variable, whose process-wide
/// table a forked child could inherit locked by a thread of its parent.
#[derive(Default)]
pub(crate) struct Doorbell {
    rung: AtomicBool,
    /// The thread that waits, from its first wait on.
    waiter: OnceLock<std::thread::Thread>,
}

impl Doorbell {
    /// Wake the thread waiting, or make its next wait return at once.
    pub(crate) fn ring(&self) {
        self.rung.store(true, Ordering::SeqCst);
        // Either the waiter is known here, or it sees `rung` before it parks (both sides
        // write one of the two and then read the other, with full fences between).
        fence(Ordering::SeqCst);
        if let Some(waiter) = self.waiter.get() {
            waiter.unpark();
        }
    }

    /// Wait until the bell rings, at most `timeout` (on one thread only).
    pub(crate) fn wait(&self, timeout: Duration) {
        self.waiter.get_or_init(std::thread::current);
        fence(Ordering::SeqCst);
        if !self.rung.swap(false, Ordering::SeqCst) {
            std::thread::park_timeout(timeout);
            self.rung.store(false, Ordering::SeqCst);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// After `grow_arena`, a thread's arena (other than the main one, which grows by `brk`
    /// and trims back) holds that much accessible memory: the mapping a block of it is in.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn a_grown_arena_has_its_pages_accessible() {
        /// The size of the private read-write mapping that holds `block`, and whether it is
        /// the main heap.
        fn mapping_of(block: *mut libc::c_void) -> Option<(usize, bool)> {
            let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
            maps.lines().find_map(|line| {
                let (start, end) = line.split_whitespace().next()?.split_once('-')?;
                let (start, end) = (usize::from_str_radix(start, 16).ok()?, usize::from_str_radix(end, 16).ok()?);
                let holds = (start..end).contains(&(block as usize)) && line.contains(" rw-p ");
                holds.then(|| (end - start, line.ends_with("[heap]")))
            })
        }
        // A thread gets a new arena, or (with as many arenas as glibc makes) the next of
        // those there are in turn, the main one among them; only a thread whose arena has
        // not grown that far yet tests anything.
        let wanted = ARENA_BLOCKS * ARENA_BLOCK;
        for _ in 0..64 {
            let grown = std::thread::spawn(move || {
                // A block too large for the thread's cache of freed blocks (which may hold
                // other arenas' blocks), so that it comes from the thread's arena.
                // SAFETY: a block of our own, freed once its mapping is known.
                let block = std::hint::black_box(unsafe { libc::malloc(4096) });
                let fresh = mapping_of(block).is_some_and(|(size, main)| !main && size < wanted);
                grow_arena();
                let grown = mapping_of(block);
                // SAFETY: the block allocated above, freed once.
                unsafe { libc::free(block) };
                fresh.then_some(grown)
            });
            if let Some(grown) = grown.join().unwrap() {
                let (accessible, _) = grown.expect("the arena's mapping");
                assert!(accessible >= wanted, "{accessible} bytes");
                return;
            }
        }
        // Under `MALLOC_ARENA_MAX=1`, say: every thread allocates from the main arena.
        eprintln!("no thread got an arena of its own that had not grown yet: nothing tested");
    }

    /// The calling thread's CPUs.
    fn cpus() -> libc::cpu_set_t {
        cpus_of_this_thread().expect("the thread's CPUs")
    }

    fn set_cpus(cpus: &libc::cpu_set_t) {
        assert!(set_cpus_of_this_thread(cpus));
    }

    fn cpu_set(cpus: &[usize]) -> libc::cpu_set_t {
        // SAFETY: a zeroed set is empty; the CPU numbers come from a set, below its size.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            for &cpu in cpus {
                libc::CPU_SET(cpu, &mut set);
            }
            set
        }
    }

    /// The CPUs in `set`.
    fn cpus_in(set: &libc::cpu_set_t) -> Vec<usize> {
        // SAFETY: CPU numbers below the set's size.
        (0..libc::CPU_SETSIZE as usize).filter(|&cpu| unsafe { libc::CPU_ISSET(cpu, set) }).collect()
    }

    /// Two CPUs this thread may run on, if it may run on two.
    fn two_cpus() -> Option<(usize, usize)> {
        let cpus = cpus_in(&cpus());
        let pair = cpus.first().copied().zip(cpus.get(1).copied());
        if pair.is_none() {
            eprintln!("one CPU to run on: nothing tested");
        }
        pair
    }

    #[test]
    #[cfg(target_env = "gnu")]
    fn steering_leaves_out_the_cpu_the_starter_is_on_unless_it_is_its_only_one() {
        let Some((here, there)) = two_cpus() else { return };
        let original = cpus();
        set_cpus(&cpu_set(&[here]));
        assert!(Steering::from_here().is_none());
        // Pinned to `here` first, this thread is on it (until the scheduler moves it, which
        // an idle `there` makes unlikely in the moment the check takes: tried a few times).
        let left_out_here = (0..10).any(|_| {
            set_cpus(&cpu_set(&[here]));
            set_cpus(&cpu_set(&[here, there]));
            let steering = Steering::from_here().expect("two CPUs to run on");
            assert_eq!(cpus_in(&steering.allowed), [here, there]);
            cpus_in(&steering.elsewhere) == [there]
        });
        set_cpus(&original);
        assert!(left_out_here);
    }

    #[test]
    #[cfg(target_env = "gnu")]
    fn a_steered_tracer_thread_starts_where_it_is_steered_then_may_run_on_its_starters_cpus() {
        let Some((here, there)) = two_cpus() else { return };
        let original = cpus();
        // A starter that may only run `here`: a thread it starts unsteered runs there too.
        set_cpus(&cpu_set(&[here]));
        let started_on = |steering| {
            TracerThread::spawn_steered(
                c"memtrace-test",
                // SAFETY: no arguments.
                || (unsafe { libc::sched_getcpu() }, cpus_in(&cpus())),
                steering,
            )
            .unwrap()
            .join()
            .unwrap()
        };
        let (cpu, cpus) = started_on(None);
        assert_eq!((cpu, cpus), (here as i32, vec![here]));
        // Once started, the thread may have been moved (its CPU is checked after it was let
        // run on both, a preemption could do it): most of ten should still be where they
        // started. Unsteered, none would be.
        let steered = (0..10)
            .filter(|_| {
                let steering = Steering { allowed: cpu_set(&[here, there]), elsewhere: cpu_set(&[there]) };
                let (cpu, cpus) = started_on(Some(steering));
                assert_eq!(cpus, [here, there]);
                cpu == there as i32
            })
            .count();
        set_cpus(&original);
        assert!(steered >= 6, "{steered} of 10 started on the CPU they were steered to");
    }

    #[test]
    fn a_tracer_thread_gives_its_result_or_its_panic() {
        let thread = TracerThread::spawn(c"memtrace-test", || 7).unwrap();
        assert_eq!(thread.join().unwrap(), 7);
        let thread = TracerThread::spawn(c"memtrace-test", || -> u8 { panic!("in the thread") }).unwrap();
        assert!(thread.join().is_err());
    }

    #[test]
    fn a_tracer_thread_is_finished_once_its_closure_returns() {
        let (go, wait) = crossbeam_channel::bounded::<()>(0);
        let thread = TracerThread::spawn(c"memtrace-test", move || wait.recv().is_ok()).unwrap();
        assert!(!thread.is_finished());
        go.send(()).unwrap();
        while !thread.is_finished() {
            std::thread::yield_now();
        }
        assert!(thread.join().unwrap());
    }

    #[test]
    fn a_ring_before_the_wait_ends_it_at_once() {
        let bell = Arc::new(Doorbell::default());
        bell.ring();
        let started = std::time::Instant::now();
        bell.wait(Duration::from_secs(60));
        assert!(started.elapsed() < Duration::from_secs(30));
        // A ring from another thread ends a wait under way.
        let ringer = Arc::clone(&bell);
        let thread = TracerThread::spawn(c"memtrace-test", move || {
            std::thread::sleep(Duration::from_millis(20));
            ringer.ring();
        })
        .unwrap();
        let started = std::time::Instant::now();
        bell.wait(Duration::from_secs(60));
        assert!(started.elapsed() < Duration::from_secs(30));
        thread.join().unwrap();
        // Unrung, the wait times out.
        let started = std::time::Instant::now();
        bell.wait(Duration::from_millis(20));
        assert!(started.elapsed() >= Duration::from_millis(20));
    }
}
