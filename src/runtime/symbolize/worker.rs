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
//!
//! A writer whose session is stopping has nothing more coming to take off the queue: the
//! addresses it asks for then are named on its own thread when no thread was started yet.
//! That is a short program's common case (its first sample is named at exit, which waits for
//! it), where starting a thread for it, then joining it, only added to the wait.

use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};

use super::Symbolizer;
use crate::format::location_codec::Location;
use crate::runtime::tracer_thread::TracerThread;

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
    /// and a note if the program was just found to miss names. `meanwhile` is called every
    /// [`WAIT_SLICE`] while the answer is being worked out, or after each address when they are
    /// named on the caller's thread. `stopping`: the caller has no other work coming (then no
    /// thread is started for this). A panic of the symbolizer is resumed here.
    pub(crate) fn locations(&mut self, addrs: &[u64], stopping: bool, mut meanwhile: impl FnMut()) -> Answer {
        if let State::Idle(_) = self.state {
            if !stopping {
                self.start();
            }
        }
        match &mut self.state {
            State::Idle(symbolizer) => named(symbolizer, addrs, meanwhile),
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
                            self.locations(addrs, stopping, meanwhile)
                        }
                    },
                    _ => unreachable!("the state was Running"),
                }
            }
            State::Gone => {
                self.state = State::Idle(Box::default());
                self.locations(addrs, stopping, meanwhile)
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
                        if answer.send(named(&mut symbolizer, &addrs, || {})).is_err() {
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

fn named(symbolizer: &mut Symbolizer, addrs: &[u64], mut after_each: impl FnMut()) -> Answer {
    symbolizer.expect(addrs);
    let locations = addrs
        .iter()
        .map(|&addr| {
            super::note_work();
            let locations = super::symbolize(symbolizer, addr);
            after_each();
            locations
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
        let named = busy.locations(&[here() + 1], false, || {}).0.remove(0);
        assert!(!named.is_empty());
        let busy = busy.take_symbolizer().unwrap();
        let mut idle = Worker::new(Symbolizer::new());
        idle.locations(&[here() + 1], false, || {});
        std::thread::sleep(IDLE_BEFORE_RELEASE * 2);
        let idle = idle.take_symbolizer().unwrap();
        assert!(parsed(&idle) < parsed(&busy), "{:?} against {:?}", idle.stats(), busy.stats());
        let mut again = Worker::new(idle);
        assert_eq!(again.locations(&[here() + 1], false, || {}).0, [named]);
    }

    /// A stopping writer's addresses are named on its own thread, as the worker's thread names
    /// them, with `meanwhile` called after each; a thread already started is used.
    #[test]
    fn a_stopping_caller_is_answered_on_its_own_thread() {
        fn here() -> u64 {
            here as *const () as usize as u64
        }
        let addrs = [here() + 1, here() + 2];
        let mut threaded = Worker::new(Symbolizer::new());
        let expected = threaded.locations(&addrs, false, || {}).0;
        assert!(matches!(threaded.state, State::Running { .. }));
        assert_eq!(threaded.locations(&addrs, true, || {}).0, expected);
        assert!(matches!(threaded.state, State::Running { .. }));
        let mut calls = 0;
        let mut stopping = Worker::new(Symbolizer::new());
        assert_eq!(stopping.locations(&addrs, true, || calls += 1).0, expected);
        assert!(matches!(stopping.state, State::Idle(_)), "no thread started");
        assert_eq!(calls, addrs.len());
        assert!(stopping.take_symbolizer().is_some());
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
        let (batch, _) = Worker::new(Symbolizer::new()).locations(&addrs, false, || {});
        let mut one = Worker::new(Symbolizer::new());
        let one_at_a_time: Vec<_> =
            addrs.iter().map(|addr| one.locations(&[*addr], false, || {}).0.remove(0)).collect();
        assert_eq!(batch, one_at_a_time);
        let innermost: Vec<_> = batch.iter().map(|l| l.last().unwrap().defname_str().into_owned()).collect();
        for (name, expected) in innermost.iter().zip(["first", "second", "0x8", "third", "first"]) {
            assert!(name.ends_with(expected), "{innermost:?}");
        }
    }
}
