//! [`ForkSafeLock`]: a lock that the fork handlers can release in the child (the running
//! session's, and the one around reads of the loader's list of objects).

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, Ordering};

/// A spin lock whose whole state is one atomic flag, so that the fork handlers can release it
/// with a plain store. (parking_lot's `force_unlock` takes a slow path through a process-wide
/// table when a waiter was parked, and in a forked child that table's lock may be held by a
/// thread that no longer exists.) Held rarely or briefly (sessions start and stop rarely; a
/// read of the loader's list takes microseconds), so waiting by yielding costs nothing that
/// matters.
pub(crate) struct ForkSafeLock<T> {
    locked: AtomicBool,
    value: UnsafeCell<T>,
}

// SAFETY: `value` is only reached through a `Guard`, which exists only while its creator holds
// `locked` (acquire on lock, release on unlock), so accesses never overlap and each sees the
// previous one's writes; `T: Send` lets the value move between the threads that lock it.
unsafe impl<T: Send> Sync for ForkSafeLock<T> {}

impl<T> ForkSafeLock<T> {
    pub(crate) const fn new(value: T) -> ForkSafeLock<T> {
        ForkSafeLock { locked: AtomicBool::new(false), value: UnsafeCell::new(value) }
    }

    pub(crate) fn lock(&self) -> Guard<'_, T> {
        while self.locked.compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed).is_err() {
            std::thread::yield_now();
        }
        Guard { lock: self }
    }

    /// The lock if it is free, without waiting.
    pub(crate) fn try_lock(&self) -> Option<Guard<'_, T>> {
        let taken = self.locked.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed).is_ok();
        taken.then_some(Guard { lock: self })
    }

    /// Release the lock held by a guard that was forgotten (the fork handlers).
    pub(crate) fn force_unlock(&self) {
        self.locked.store(false, Ordering::Release);
    }
}

/// Access to the value while its [`ForkSafeLock`] is held.
pub(crate) struct Guard<'a, T> {
    lock: &'a ForkSafeLock<T>,
}

impl<T> std::ops::Deref for Guard<'_, T> {
    type Target = T;

    fn deref(&self) -> &T {
        // SAFETY: this guard holds the lock, so no other reference to the value exists.
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> std::ops::DerefMut for Guard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as for `deref`; `&mut self` makes this the only reference through the guard.
        unsafe { &mut *self.lock.value.get() }
    }
}

impl<T> Drop for Guard<'_, T> {
    fn drop(&mut self) {
        self.lock.force_unlock();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_forgotten_guard_is_released_by_force_unlock() {
        static LOCK: ForkSafeLock<u32> = ForkSafeLock::new(0);
        *LOCK.lock() += 1;
        std::mem::forget(LOCK.lock());
        LOCK.force_unlock();
        assert_eq!(*LOCK.lock(), 1);
        let threads: Vec<_> =
            (0..4).map(|_| std::thread::spawn(|| (0..1000).for_each(|_| *LOCK.lock() += 1))).collect();
        threads.into_iter().for_each(|t| t.join().unwrap());
        assert_eq!(*LOCK.lock(), 4001);
    }
}
