//! The writer's symbolizer, on the writer's thread at first and then on a thread of its own,
//! so that the writer keeps taking samples off the queue while a frame is named: naming the
//! first frame of a compilation unit parses the unit, which takes milliseconds, and tens of
//! them for a large unit of an unoptimised build, while a program at a high rate fills the
//! queue in less.
//!
//! The first [`NAMING_ON_CALLER`] of naming are done on the writer's thread, which takes the
//! queue into its backlog after each address; a request the budget runs out in has the rest
//! of its addresses named on the thread. That is all a short program needs (its first samples
//! are named as it runs and at its stop, which waits for them), and a thread for it only
//! added to the wait: its start, a first turn that can come a millisecond later, a wake-up for
//! each answer and one to join it (README.md at cfd4150, "Benchmarks"). One address is not interrupted: it
//! stops the draining of the queue for as long as it takes (tens of milliseconds at most in
//! an unoptimised build, as measured there), which the queue, sized for 0.125 s of a program
//! allocating 8 GB/s, absorbs. A writer whose session is stopping has nothing more coming to
//! take off the queue, and never starts the thread.
//!
//! The writer asks for all the new addresses of a sample in one request, which the thread
//! answers in one message: each round trip costs both threads context switches, more than
//! naming an address of a unit already parsed. It waits for the answer in short slices, doing
//! its other work in between ([`Worker::locations`]). The thread ends when the worker is
//! dropped (its requests channel closes; it is not waited for) or its symbolizer taken back.
//! A second without an address to name, the symbolizer gives back the memory naming took:
//! the thread sees to it, or the writer ([`Worker::release_if_idle`]) before there is one.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};

use super::{Desk, Symbolizer};
use crate::format::location_codec::Location;
use crate::runtime::tracer_thread::{self, TracerThread};

/// How long naming may take on the writer's thread, in all, before a thread is started for it.
const NAMING_ON_CALLER: Duration = Duration::from_millis(20);

/// The fewest addresses worth lending (see [`super::lending`]): the helper's first address in
/// a unit parses it again.
const LENT_AT_LEAST: usize = 2;

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

/// The symbolizer, on the caller's thread and then on its own.
pub(crate) struct Worker {
    state: State,
    /// Naming done on the caller's thread so far, and how much may be before a thread starts.
    on_caller: Duration,
    on_caller_budget: Duration,
    /// When addresses were last named on the caller's thread, if not released since.
    named_on_caller: Option<Instant>,
    /// Whether the caller's malloc arena was grown for naming ([`tracer_thread::grow_arena`]).
    arena_grown: bool,
    /// Where addresses are lent to the thread that stops the session.
    desk: Option<Arc<Desk>>,
}

enum State {
    /// No thread yet (or none could be started): addresses are named on the caller's.
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
        Worker::with_budget(symbolizer, NAMING_ON_CALLER)
    }

    fn with_budget(symbolizer: Symbolizer, on_caller_budget: Duration) -> Worker {
        Worker {
            state: State::Idle(Box::new(symbolizer)),
            on_caller: Duration::ZERO,
            on_caller_budget,
            named_on_caller: None,
            arena_grown: false,
            desk: None,
        }
    }

    /// The worker, lending addresses at `desk` to a thread that waits there while they are
    /// named (see [`super::lending`]).
    pub(crate) fn lending_at(self, desk: Arc<Desk>) -> Worker {
        Worker { desk: Some(desk), ..self }
    }

    /// The locations of each return address of `addrs` (see [`super::symbolize`]), in order,
    /// and a note if the program was just found to miss names. `meanwhile` is called every
    /// [`WAIT_SLICE`] while the answer is being worked out on the thread, or after each address
    /// named on the caller's. `stopping`: the caller has no other work coming (then no
    /// thread is started for this). A panic of the symbolizer is resumed here.
    pub(crate) fn locations(&mut self, addrs: &[u64], stopping: bool, mut meanwhile: impl FnMut()) -> Answer {
        if let State::Idle(_) = self.state {
            if !stopping && self.on_caller >= self.on_caller_budget {
                self.start();
            }
        }
        match &mut self.state {
            State::Idle(symbolizer) => {
                if !std::mem::replace(&mut self.arena_grown, true) {
                    tracer_thread::grow_arena();
                }
                let began = Instant::now();
                // Not past the budget, unless no thread could be started for the rest.
                let left = self.on_caller_budget.checked_sub(self.on_caller).filter(|_| !stopping);
                let deadline = left.map(|left| began + left);
                let (mut locations, note) = named(symbolizer, addrs, &mut meanwhile, deadline, self.desk.as_deref());
                let now = Instant::now();
                self.on_caller += now - began;
                self.named_on_caller = Some(now);
                if locations.len() < addrs.len() {
                    // The budget ran out part-way: the rest on the thread.
                    let (rest, later_note) = self.locations(&addrs[locations.len()..], stopping, meanwhile);
                    locations.extend(rest);
                    return (locations, note.or(later_note));
                }
                (locations, note)
            }
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

    /// Give back the memory naming on the caller's thread took, once it has named nothing for
    /// a second at `now` (the thread, once started, sees to its own).
    pub(crate) fn release_if_idle(&mut self, now: Instant) {
        if let (State::Idle(symbolizer), Some(last)) = (&mut self.state, self.named_on_caller) {
            if now.saturating_duration_since(last) >= IDLE_BEFORE_RELEASE {
                symbolizer.release();
                self.named_on_caller = None;
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
        let desk = self.desk.clone();
        // Not steered off the writer's CPU (`TracerThread::spawn_beside`): the writer mostly
        // waits for its answers, and a CPU other than the writer's is more likely the program's.
        let spawned = TracerThread::spawn(c"memtrace-symbol", move || {
            let mut symbolizer = given.lock().take().unwrap_or_default();
            tracer_thread::grow_arena();
            let mut named_since_release = false;
            loop {
                match requested.recv_timeout(IDLE_BEFORE_RELEASE) {
                    Ok(addrs) => {
                        named_since_release = true;
                        if answer.send(named(&mut symbolizer, &addrs, || {}, None, desk.as_deref())).is_err() {
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

/// The locations of `addrs`, with `after_each` called after each address; only of those
/// named before `deadline` (at least the first) when there is one. With a `desk`, those in
/// the program are lent there as naming starts (see [`super::lending`]): a thread stopping
/// the session that picks the loan up names some of them from the last back, and then all are
/// named, whatever the deadline.
fn named(
    symbolizer: &mut Symbolizer,
    addrs: &[u64],
    mut after_each: impl FnMut(),
    mut deadline: Option<Instant>,
    desk: Option<&Desk>,
) -> Answer {
    symbolizer.expect(addrs);
    let mut locations: Vec<Option<Arc<[Location]>>> = vec![None; addrs.len()];
    let mut name = |symbolizer: &mut Symbolizer, locations: &mut [Option<Arc<[Location]>>], k: usize| {
        super::note_work();
        locations[k] = Some(super::symbolize(symbolizer, addrs[k]));
        after_each();
    };
    let mut loan =
        desk.filter(|_| addrs.len() > LENT_AT_LEAST).and_then(|desk| Some((desk.lend(symbolizer.lend(addrs)?), desk)));
    for k in 0..addrs.len() {
        if k > 0 && deadline.is_some_and(|deadline| Instant::now() >= deadline) {
            match loan.take().map(|(lent, desk)| desk.withdraw(lent).map_err(|lent| (lent, desk))) {
                // Out of time, and no one helps: the rest is left.
                None | Some(Ok(())) => break,
                Some(Err(helped)) => (loan, deadline) = (Some(helped), None),
            }
        }
        if loan.as_ref().is_none_or(|(loan, _)| loan.claim(k)) {
            name(symbolizer, &mut locations, k);
        }
    }
    if let Some((loan, desk)) = loan {
        for (k, answer) in desk.settle(loan).unwrap_or_default() {
            locations[k] = Some(super::locations(addrs[k], answer, symbolizer));
        }
        // Those the helper failed to name.
        for k in 0..addrs.len() {
            if locations[k].is_none() {
                name(symbolizer, &mut locations, k);
            }
        }
    }
    (locations.into_iter().map_while(|l| l).collect(), symbolizer.take_program_note())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A worker a second without addresses gives back the parsed DWARF: its thread by itself,
    /// the caller's when told the time.
    #[test]
    fn an_idle_worker_releases_what_naming_parsed() {
        fn here() -> u64 {
            here as *const () as usize as u64
        }
        let parsed = |symbolizer: &Symbolizer| {
            let stats = symbolizer.stats();
            stats.estimated_bytes - stats.base_bytes
        };
        let threaded = || Worker::with_budget(Symbolizer::new(), Duration::ZERO);
        let mut busy = threaded();
        let named = busy.locations(&[here() + 1], false, || {}).0.remove(0);
        assert!(!named.is_empty());
        let busy = busy.take_symbolizer().unwrap();
        let mut idle = threaded();
        idle.locations(&[here() + 1], false, || {});
        std::thread::sleep(IDLE_BEFORE_RELEASE * 2);
        let idle = idle.take_symbolizer().unwrap();
        assert!(parsed(&idle) < parsed(&busy), "{:?} against {:?}", idle.stats(), busy.stats());
        let mut again = Worker::with_budget(idle, Duration::ZERO);
        assert_eq!(again.locations(&[here() + 1], false, || {}).0, std::slice::from_ref(&named));
        let mut on_caller = Worker::new(Symbolizer::new());
        assert_eq!(on_caller.locations(&[here() + 1], false, || {}).0, [named]);
        let State::Idle(symbolizer) = &on_caller.state else { panic!("named on the caller's thread") };
        let before = parsed(symbolizer);
        assert_eq!(before, parsed(&busy));
        let named_at = on_caller.named_on_caller.unwrap();
        on_caller.release_if_idle(named_at + IDLE_BEFORE_RELEASE / 2);
        assert!(matches!(&on_caller.state, State::Idle(s) if parsed(s) == before), "not idle long enough");
        on_caller.release_if_idle(named_at + IDLE_BEFORE_RELEASE);
        assert!(matches!(&on_caller.state, State::Idle(s) if parsed(s) < before));
    }

    /// A batch is lent as its naming starts, and a thread that picks the loan up names some of
    /// its addresses (from the last back) as the caller names the others (from the first on):
    /// the answers are those the caller gives alone, even past the caller's deadline. A loan no
    /// one picks up is named by the caller, or withdrawn at its deadline.
    #[test]
    fn addresses_lent_to_a_helping_thread_are_named_alike() {
        let functions = [
            tracer_thread::grow_arena as *const () as usize,
            super::super::work_done as *const () as usize,
            super::super::options_from_env as *const () as usize,
            super::super::loader_changes as *const () as usize,
            Symbolizer::new as *const () as usize,
            Worker::new as *const () as usize,
            crate::runtime::state::getpid as *const () as usize,
            super::super::symbolize as *const () as usize,
        ];
        let mut addrs: Vec<u64> = functions.iter().flat_map(|&f| [1, 5, 9].map(|into| (f + into) as u64)).collect();
        addrs.sort_unstable();
        addrs.dedup();
        let alone = named(&mut Symbolizer::new(), &addrs, || {}, None, None).0;
        let desk = Desk::default();
        let passed = Some(Instant::now());
        for deadline in [None, passed] {
            let received = std::sync::atomic::AtomicBool::new(false);
            let (helped, together) = std::thread::scope(|scope| {
                let helper = scope.spawn(|| {
                    let deadline = Instant::now() + Duration::from_secs(10);
                    while Instant::now() < deadline {
                        if let Ok(lent) = desk.loans().try_recv() {
                            received.store(true, std::sync::atomic::Ordering::Release);
                            return desk.help(lent);
                        }
                        std::hint::spin_loop();
                    }
                    0
                });
                // The caller goes on from its first address once the helper has the loan: a
                // helper not yet running (two threads on one CPU) could find it all claimed.
                let deadline_here = Instant::now() + Duration::from_secs(10);
                let has_the_loan = || {
                    while !received.load(std::sync::atomic::Ordering::Acquire) && Instant::now() < deadline_here {
                        std::thread::yield_now();
                    }
                };
                let together = named(&mut Symbolizer::new(), &addrs, has_the_loan, deadline, Some(&desk)).0;
                (helper.join().unwrap(), together)
            });
            assert_eq!(together, alone, "deadline {deadline:?}");
            assert!(helped > 0, "the helping thread named none of the {} addresses", addrs.len());
        }
        let unattended = named(&mut Symbolizer::new(), &addrs, || {}, None, Some(&desk)).0;
        assert_eq!(unattended, alone);
        let (out_of_time, _) = named(&mut Symbolizer::new(), &addrs, || {}, passed, Some(&desk));
        assert_eq!(out_of_time, alone[..1]);
        assert!(desk.loans().is_empty(), "the loan withdrawn");
    }

    /// Addresses are named on the caller's thread, with `meanwhile` called after each, until
    /// naming there has taken its budget, then on a thread (the rest of a request the budget
    /// ran out in too), with the same answers. A stopping caller starts no thread, and uses
    /// one already started.
    #[test]
    fn naming_moves_to_a_thread_after_the_callers_budget() {
        fn here() -> u64 {
            here as *const () as usize as u64
        }
        let addrs = [here() + 1, here() + 2, here() + 3];
        let mut calls = 0;
        let mut roomy = Worker::with_budget(Symbolizer::new(), Duration::from_secs(3600));
        let expected = roomy.locations(&addrs, false, || calls += 1).0;
        assert_eq!(calls, addrs.len());
        assert!(matches!(roomy.state, State::Idle(_)), "no thread started within the budget");
        assert!(roomy.on_caller > Duration::ZERO);
        let mut stopping = Worker::with_budget(Symbolizer::new(), Duration::from_nanos(1));
        assert_eq!(stopping.locations(&addrs, true, || {}).0, expected);
        assert_eq!(stopping.locations(&addrs, true, || {}).0, expected);
        assert!(matches!(stopping.state, State::Idle(_)), "a stopping caller starts no thread");
        let (mut calls, mut tight) = (0, Worker::with_budget(Symbolizer::new(), Duration::from_nanos(1)));
        assert_eq!(tight.locations(&addrs, false, || calls += 1).0, expected);
        assert!(matches!(tight.state, State::Running { .. }), "the budget spent part-way");
        assert!(calls >= 1, "the first address named on the caller's thread");
        assert_eq!(tight.locations(&addrs, true, || {}).0, expected);
        assert!(matches!(tight.state, State::Running { .. }));
        assert!(tight.take_symbolizer().is_some());
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
