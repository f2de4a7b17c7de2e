//! The writer's symbolizer on a thread of its own, so that the writer keeps taking samples off
//! the queue while a frame is named: naming the first frame of a compilation unit parses the
//! unit, which takes milliseconds, and hundreds of them for a large unit of an unoptimised
//! build, while a program at a high rate fills the queue in less.
//!
//! The writer asks for one address at a time and waits for the answer in short slices, doing
//! its other work in between ([`Worker::locations`]). The thread is started at the first
//! address (a run with no sample starts none) and ends when the worker is dropped (its
//! requests channel closes; it is not waited for) or its symbolizer taken back. Idle for a
//! second, it gives back the memory naming took.

use std::path::PathBuf;
use std::sync::Arc;
use std::thread::JoinHandle;
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

/// An answer: the locations of an address, and the program's path when the symbolizer just
/// found it has no debug info.
type Answer = (Arc<[Location]>, Option<PathBuf>);

/// The symbolizer, on its thread once an address was asked for.
pub(crate) struct Worker {
    state: State,
}

enum State {
    /// No thread yet (or none could be started: then addresses are named on the caller's).
    Idle(Box<Symbolizer>),
    Running {
        requests: Sender<u64>,
        answers: Receiver<Answer>,
        thread: JoinHandle<Symbolizer>,
    },
    /// The symbolizer was taken back.
    Gone,
}

impl Worker {
    /// A worker that will name addresses with `symbolizer`.
    pub(crate) fn new(symbolizer: Symbolizer) -> Worker {
        Worker { state: State::Idle(Box::new(symbolizer)) }
    }

    /// The locations of return address `addr` (see [`super::symbolize`]), and the program's
    /// path if it was just found to have no debug info. `meanwhile` is called every
    /// [`WAIT_SLICE`] while the answer is being worked out. A panic of the symbolizer is
    /// resumed here.
    pub(crate) fn locations(&mut self, addr: u64, mut meanwhile: impl FnMut()) -> Answer {
        if let State::Idle(_) = self.state {
            self.start();
        }
        match &mut self.state {
            State::Idle(symbolizer) => named(symbolizer, addr),
            State::Running { requests, answers, .. } => {
                if requests.send(addr).is_ok() {
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
                            self.locations(addr, meanwhile)
                        }
                    },
                    _ => unreachable!("the state was Running"),
                }
            }
            State::Gone => {
                self.state = State::Idle(Box::default());
                self.locations(addr, meanwhile)
            }
        }
    }

    fn start(&mut self) {
        let State::Idle(symbolizer) = std::mem::replace(&mut self.state, State::Gone) else { return };
        let (requests, requested) = crossbeam_channel::unbounded::<u64>();
        let (answer, answers) = crossbeam_channel::unbounded();
        // The symbolizer moves into the thread only if it starts.
        let slot = Arc::new(parking_lot::Mutex::new(Some(*symbolizer)));
        let given = Arc::clone(&slot);
        let spawned = std::thread::Builder::new().name("memtrace-symbols".into()).spawn(move || {
            sampler::enter_tracer_forever();
            let mut symbolizer = given.lock().take().unwrap_or_default();
            let mut named_since_release = false;
            loop {
                match requested.recv_timeout(IDLE_BEFORE_RELEASE) {
                    Ok(addr) => {
                        named_since_release = true;
                        if answer.send(named(&mut symbolizer, addr)).is_err() {
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

fn named(symbolizer: &mut Symbolizer, addr: u64) -> Answer {
    let locations = super::symbolize(symbolizer, addr);
    (locations, symbolizer.take_program_without_debug_info())
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
        let (named, _) = busy.locations(here() + 1, || {});
        assert!(!named.is_empty());
        let busy = busy.take_symbolizer().unwrap();
        let mut idle = Worker::new(Symbolizer::new());
        idle.locations(here() + 1, || {});
        std::thread::sleep(IDLE_BEFORE_RELEASE * 2);
        let idle = idle.take_symbolizer().unwrap();
        assert!(parsed(&idle) < parsed(&busy), "{:?} against {:?}", idle.stats(), busy.stats());
        let mut again = Worker::new(idle);
        assert_eq!(again.locations(here() + 1, || {}).0, named);
    }
}
