//! Naming shared with the thread that stops a session. It waits for the writer to name the
//! frames of the last samples and close the trace, and for a short program most of the naming
//! comes then: its samples were taken milliseconds before it ended. While it waits its CPU is
//! idle, so it names some of the addresses left, with a reader of the program's DWARF of its
//! own ([`Symbolizer::lend`](super::Symbolizer::lend)), beside the writer.
//!
//! A [`Desk`] is where the two meet. The writer lends each batch of addresses in the program
//! there as it starts to name it ([`Lent`]), and names them from the first on; a stopping
//! thread that comes to wait takes the loan at once, without waiting for the address being
//! named, and names them from the last back, until the two meet (so neither waits for the
//! other's slower addresses, and a loan no one picks up is all named by the writer). One loan is
//! out at a time: the writer settles each before its next batch.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crossbeam_channel::{Receiver, Sender};

use super::object_file::{Found, Sibling};
use super::symbolizer::{self, Answer};

/// How much stack a thread must have left to help: half of what the writer's thread, which
/// names frames on it, has in all (a thread std starts has as much in all).
pub(crate) const HELPING_STACK: usize = crate::runtime::tracer_thread::STACK_SIZE / 2;

/// How many addresses threads helping at a desk have named in this process.
static HELPED: AtomicU64 = AtomicU64::new(0);

/// How many addresses threads helping at a desk have named in this process (for tests).
#[cfg(debug_assertions)]
pub(crate) fn addresses_named_by_helpers() -> u64 {
    HELPED.load(Ordering::Relaxed)
}

/// Addresses of one object lent to another thread to name.
pub(crate) struct Lent {
    sibling: Sibling,
    /// Each address's place in the lender's batch, and what the object's tables found.
    found: Vec<(usize, Found)>,
    claims: Arc<Claims>,
}

impl Lent {
    pub(super) fn new(sibling: Sibling, found: Vec<(usize, Found)>) -> Lent {
        let claims = Arc::new(Claims::new(found.len()));
        Lent { sibling, found, claims }
    }

    /// The answers of the addresses this thread claims, from the last back, with their places:
    /// what [`Symbolizer::symbolize`](super::Symbolizer::symbolize) gives.
    fn name(mut self) -> Vec<(usize, Answer)> {
        let mut answers = Vec::new();
        while let Some(i) = self.claims.take(End::Back) {
            super::note_work();
            let (place, found) = self.found[i];
            answers.push((place, symbolizer::answer(self.sibling.lookup(found), Arc::from)));
        }
        answers
    }
}

/// What the lender keeps of a loan: the places of the addresses lent, and a claim on them.
pub(crate) struct Loan {
    places: Vec<usize>,
    claims: Arc<Claims>,
}

impl Loan {
    /// Whether the lender names the address at `place` of the batch: one not lent, or the
    /// first lent one not claimed yet, claimed now. The lender asks in the order of the batch.
    pub(crate) fn claim(&self, place: usize) -> bool {
        if self.places.binary_search(&place).is_err() {
            return true;
        }
        let claimed = self.claims.take(End::Front).map(|i| self.places[i]);
        debug_assert!(claimed.is_none_or(|claimed| claimed == place), "claimed out of order");
        claimed.is_some()
    }
}

/// Which end of a loan an address is claimed from.
#[derive(Clone, Copy, PartialEq)]
enum End {
    Front,
    Back,
}

/// The addresses of a loan not claimed yet: from `front` (the low half) to `back` (the high
/// half, exclusive), in one word, so that a claim from either end is one compare-and-swap.
struct Claims(AtomicU64);

impl Claims {
    fn new(len: usize) -> Claims {
        Claims(AtomicU64::new((len as u64) << 32))
    }

    fn take(&self, end: End) -> Option<usize> {
        let mut now = self.0.load(Ordering::Acquire);
        loop {
            let (front, back) = (now & u64::from(u32::MAX), now >> 32);
            if front >= back {
                return None;
            }
            let (taken, next) = match end {
                End::Front => (front, (front + 1) | back << 32),
                End::Back => (back - 1, front | (back - 1) << 32),
            };
            match self.0.compare_exchange_weak(now, next, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return Some(taken as usize),
                Err(seen) => now = seen,
            }
        }
    }
}

/// The answers of a loan's helper, with their places in the batch; `None` when naming them
/// panicked.
type Answers = Option<Vec<(usize, Answer)>>;

/// Where the writer lends addresses to name to the thread that stops its session.
pub(crate) struct Desk {
    loans: (Sender<Lent>, Receiver<Lent>),
    answers: (Sender<Answers>, Receiver<Answers>),
}

impl Default for Desk {
    fn default() -> Desk {
        Desk { loans: crossbeam_channel::bounded(1), answers: crossbeam_channel::bounded(1) }
    }
}

impl Desk {
    /// Where loans come, for the helping thread to wait on with its other work.
    pub(crate) fn loans(&self) -> &Receiver<Lent> {
        &self.loans.1
    }

    /// Name the addresses of `lent` this thread claims, and hand the writer their answers:
    /// how many there were.
    pub(crate) fn help(&self, lent: Lent) -> usize {
        let answers = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| lent.name())).ok();
        let named = answers.as_ref().map_or(0, Vec::len);
        HELPED.fetch_add(named as u64, Ordering::Relaxed);
        let _ = self.answers.0.try_send(answers);
        named
    }

    /// Lend `lent`. Once the lender has named what it claims, it settles the loan
    /// ([`Desk::settle`]), or withdraws it ([`Desk::withdraw`]), before it lends again.
    pub(crate) fn lend(&self, lent: Lent) -> Loan {
        let loan =
            Loan { places: lent.found.iter().map(|&(place, _)| place).collect(), claims: Arc::clone(&lent.claims) };
        let _ = self.loans.0.try_send(lent);
        loan
    }

    /// Take `loan` back if no one has picked it up (then the lender may leave what it has not
    /// named unnamed); else give it back.
    pub(crate) fn withdraw(&self, loan: Loan) -> Result<(), Loan> {
        match self.loans.1.try_recv() {
            Ok(_) => Ok(()),
            Err(_) => Err(loan),
        }
    }

    /// The helper's answers, with their places, once it has them: none when no one picked the
    /// loan up, and `None` when naming them panicked (the lender names those itself).
    pub(crate) fn settle(&self, loan: Loan) -> Answers {
        match self.withdraw(loan) {
            Ok(()) => Some(Vec::new()),
            Err(_) => self.answers.1.recv().ok().flatten(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Claims from both ends of a loan, from two threads, take each address once.
    #[test]
    fn claims_from_both_ends_take_each_address_once() {
        let claims = Claims::new(10_000);
        let (front, back) = std::thread::scope(|scope| {
            let front = scope.spawn(|| std::iter::from_fn(|| claims.take(End::Front)).collect::<Vec<_>>());
            let back: Vec<usize> = std::iter::from_fn(|| claims.take(End::Back)).collect();
            (front.join().unwrap(), back)
        });
        assert!(front.windows(2).all(|w| w[0] < w[1]) && back.windows(2).all(|w| w[0] > w[1]));
        let mut all: Vec<usize> = front.iter().chain(&back).copied().collect();
        all.sort_unstable();
        assert_eq!(all, (0..10_000).collect::<Vec<_>>());
    }
}
