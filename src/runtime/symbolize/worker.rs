//! The writer's symbolizer on a thread of its own, so that the writer keeps taking samples off
//! the queue while a frame is named: naming the first frame of a compilation unit parses the
//! unit, which takes milliseconds, and hundreds of them for a large unit of an unoptimised
//! build, while a program at a high rate fills the queue in less.
//!
//! The writer asks for all the new addresses of a sample in one request, which the thread
//! answers in one message: each round trip costs both threads context switches, more than
//! naming an address of a unit already parsed. It waits for the answer in short slices, doing
//! its other work in between ([`Worker::locations`]). The thread is started at the first
//! address (a run with no sample starts none) and ends when the worker is dropped (its
//! requests channel closes; it is not waited for) or its symbolizer taken back. Idle for a
//! second, it gives back the memory naming took.

use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};

use super::Symbolizer;
use crate::format::location_codec::Location;
use crate::runtime::sampler;

/// How long the writer waits for an answer before it looks at its other work.
const WAIT_SLICE: Duration = Duration::from_millis(1);

/// How long the thread goes without an address to name before it gives back what naming
/// made resident ([`Symbolizer::release`]): most new addresses come in a program's first
/// moments, and a long-running program should not keep their parsed DWARF.
const IDLE_BEFORE_RELEASE: Duration = Duration::from_secs(1);

/// An answer: the locations of each address asked for, in order, and a note for the program's
/// user when the symbolizer just found that its frames miss names
/// ([`Symbolizer::take_program_note`]).
type Answer = (Vec<Arc<[Location]>>, Option<String>);

/// The symbolizer, on its thread once an address was asked for.
pub(crate) struct Worker {
    state: State,
}

enum State {
    /// No thread yet (or none could be started: then addresses are named on the caller's).
    Idle(Box<Symbolizer>),
    Running {
        requests: Sender<Vec<u64>>,
        answers: Receiver<Answer>,
        thread: TracerThread<Symbolizer>,
    },
    /// The symbolizer was taken back.
    Gone,
}

impl Worker {
    /// A worker that will name addresses with `symbolizer`.
    pub(crate) fn new(symbolizer: Symbolizer) -> Worker {
        Worker { state: State::Idle(Box::new(symbolizer)) }
    }

    /// The locations of each return address of `addrs` (see [`super::symbolize`]), in order,
    /// and a note if the program was just found to miss names. `meanwhile` is
    /// called every [`WAIT_SLICE`] while the answer is being worked out. A panic of the
    /// symbolizer is resumed here.
    pub(crate) fn locations(&mut self, addrs: &[u64], mut meanwhile: impl FnMut()) -> Answer {
        if let State::Idle(_) = self.state {
            self.start();
        }
        match &mut self.state {
            State::Idle(symbolizer) => named(symbolizer, addrs),
            State::Running { requests, answers, .. } => {
                if requests.send(addrs.to_vec()).is_ok() {
                    loop {
                        match answers.recv_timeout(WAIT_SLICE) {
                            Ok(answer) => return answer,
                            Err(RecvTimeoutError::Timeout) => meanwhile(),
                            Err(RecvTimeoutError::Disconnected) => break,
                        }
                    }
                }
                // The thread ended: it panicked.
                match std::mem::replace(&mut self.state, State::Gone) {
                    State::Running { thread, .. } => match thread.join() {
                        Err(panic) => std::panic::resume_unwind(panic),
                        Ok(symbolizer) => {
                            self.state = State::Idle(Box::new(symbolizer));
                            self.locations(addrs, meanwhile)
                        }
                    },
                    _ => unreachable!("the state was Running"),
                }
            }
            State::Gone => {
                self.state = State::Idle(Box::default());
                self.locations(addrs, meanwhile)
            }
        }
    }

    fn start(&mut self) {
        let State::Idle(symbolizer) = std::mem::replace(&mut self.state, State::Gone) else { return };
        let (requests, requested) = crossbeam_channel::unbounded::<Vec<u64>>();
        let (answer, answers) = crossbeam_channel::unbounded();
        // The symbolizer moves into the thread only if it starts.
        let slot = Arc::new(parking_lot::Mutex::new(Some(*symbolizer)));
        let given = Arc::clone(&slot);
        let spawned = TracerThread::spawn(c"memtrace-symbol", move || {
            let mut symbolizer = given.lock().take().unwrap_or_default();
            let mut named_since_release = false;
            loop {
                match requested.recv_timeout(IDLE_BEFORE_RELEASE) {
                    Ok(addrs) => {
                        named_since_release = true;
                        if answer.send(named(&mut symbolizer, &addrs)).is_err() {
                            break;
                        }
                    }
                    Err(RecvTimeoutError::Timeout) if named_since_release => {
                        named_since_release = false;
                        symbolizer.release();
                    }
                    Err(RecvTimeoutError::Timeout) => {}
                    Err(RecvTimeoutError::Disconnected) => break,
                }
            }
            symbolizer
        });
        self.state = match spawned {
            Ok(thread) => State::Running { requests, answers, thread },
            Err(_) => State::Idle(Box::new(slot.lock().take().unwrap_or_default())),
        };
    }

    /// The symbolizer back, once its thread has finished what it was asked (for the next
    /// session: what it parsed is kept). `None` after a panic.
    pub(crate) fn take_symbolizer(&mut self) -> Option<Symbolizer> {
        match std::mem::replace(&mut self.state, State::Gone) {
            State::Idle(symbolizer) => Some(*symbolizer),
            State::Running { requests, thread, .. } => {
                drop(requests);
                thread.join().ok()
            }
            State::Gone => None,
        }
    }
}

/// A thread started with `pthread_create` itself rather than `std::thread`, so that nothing
/// runs on it before it is marked a tracer thread: std's start of a thread allocates (its
/// spawn hooks' thread-local), and on the thread of a running session the sampler could take
/// that allocation for the program's. Its closure's result (or panic) is handed over through
/// a shared slot, so that a thread never joined drops it as it ends.
struct TracerThread<T> {
    thread: libc::pthread_t,
    result: Arc<parking_lot::Mutex<Option<std::thread::Result<T>>>>,
}

/// What the new thread is given: its closure and where to put the result.
type Start<T> = (Box<dyn FnOnce() -> T + Send>, Arc<parking_lot::Mutex<Option<std::thread::Result<T>>>>);

impl<T: Send + 'static> TracerThread<T> {
    fn spawn(name: &'static std::ffi::CStr, f: impl FnOnce() -> T + Send + 'static) -> std::io::Result<Self> {
        extern "C" fn run<T>(start: *mut libc::c_void) -> *mut libc::c_void {
            sampler::enter_tracer_forever();
            // SAFETY: `start` is the box `spawn` leaked for this thread, taken back once, here.
            let (f, result) = *unsafe { Box::from_raw(start as *mut Start<T>) };
            let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
            *result.lock() = Some(outcome);
            std::ptr::null_mut()
        }
        let result = Arc::new(parking_lot::Mutex::new(None));
        let start: Box<Start<T>> = Box::new((Box::new(f), Arc::clone(&result)));
        let start = Box::into_raw(start) as *mut libc::c_void;
        let mut thread = 0;
        // SAFETY: `run::<T>` takes `start` back; default attributes.
        let error = unsafe { libc::pthread_create(&mut thread, std::ptr::null(), run::<T>, start) };
        if error != 0 {
            // SAFETY: the thread was not created: the box is still ours.
            drop(unsafe { Box::from_raw(start as *mut Start<T>) });
            return Err(std::io::Error::from_raw_os_error(error));
        }
        // SAFETY: `thread` is a live thread (not yet joined or detached); `name` is NUL-terminated
        // (the kernel keeps 15 bytes of a name: a longer one is refused).
        unsafe { libc::pthread_setname_np(thread, name.as_ptr()) };
        Ok(TracerThread { thread, result })
    }

    /// Wait for the thread to end: its closure's result, or its panic.
    fn join(self) -> std::thread::Result<T> {
        let this = std::mem::ManuallyDrop::new(self);
        // SAFETY: joined once (`self` is consumed and its `Drop`, which detaches, skipped).
        unsafe { libc::pthread_join(this.thread, std::ptr::null_mut()) };
        // SAFETY: read out of the `ManuallyDrop` once; nothing else uses `this` after.
        let result = unsafe { std::ptr::read(&this.result) };
        let outcome = result.lock().take();
        outcome.unwrap_or_else(|| Err(Box::new("the tracer thread ended without a result")))
    }
}

impl<T> Drop for TracerThread<T> {
    fn drop(&mut self) {
        // SAFETY: a live thread never joined: it cleans up after itself as it ends.
        unsafe { libc::pthread_detach(self.thread) };
    }
}

fn named(symbolizer: &mut Symbolizer, addrs: &[u64]) -> Answer {
    let locations = addrs
        .iter()
        .map(|&addr| {
            super::note_work();
            super::symbolize(symbolizer, addr)
        })
        .collect();
    (locations, symbolizer.take_program_note())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The thread, a while without addresses, gives back the parsed DWARF.
    #[test]
    fn an_idle_worker_releases_what_naming_parsed() {
        fn here() -> u64 {
            here as *const () as usize as u64
        }
        let parsed = |symbolizer: &Symbolizer| {
            let stats = symbolizer.stats();
            stats.estimated_bytes - stats.base_bytes
        };
        let mut busy = Worker::new(Symbolizer::new());
        let named = busy.locations(&[here() + 1], || {}).0.remove(0);
        assert!(!named.is_empty());
        let busy = busy.take_symbolizer().unwrap();
        let mut idle = Worker::new(Symbolizer::new());
        idle.locations(&[here() + 1], || {});
        std::thread::sleep(IDLE_BEFORE_RELEASE * 2);
        let idle = idle.take_symbolizer().unwrap();
        assert!(parsed(&idle) < parsed(&busy), "{:?} against {:?}", idle.stats(), busy.stats());
        let mut again = Worker::new(idle);
        assert_eq!(again.locations(&[here() + 1], || {}).0, [named]);
    }

    /// A batch of addresses gets, in order, the answers that asking one at a time gives.
    #[test]
    fn a_batch_is_named_as_its_addresses_one_at_a_time() {
        fn first() -> u64 {
            std::hint::black_box(1)
        }
        fn second() -> u64 {
            std::hint::black_box(2)
        }
        fn third() -> u64 {
            std::hint::black_box(3)
        }
        let functions = [first as fn() -> u64, second, third].map(|f| f as usize as u64 + 1);
        // A repeated address, and one with no symbol among them.
        let addrs = [functions[0], functions[1], 8, functions[2], functions[0]];
        let (batch, _) = Worker::new(Symbolizer::new()).locations(&addrs, || {});
        let mut one = Worker::new(Symbolizer::new());
        let one_at_a_time: Vec<_> = addrs.iter().map(|addr| one.locations(&[*addr], || {}).0.remove(0)).collect();
        assert_eq!(batch, one_at_a_time);
        let innermost: Vec<_> = batch.iter().map(|l| l.last().unwrap().defname_str().into_owned()).collect();
        for (name, expected) in innermost.iter().zip(["first", "second", "0x8", "third", "first"]) {
            assert!(name.ends_with(expected), "{innermost:?}");
        }
    }
}
