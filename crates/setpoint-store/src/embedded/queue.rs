//! The committer's request queue.
//!
//! A mutex-protected deque with a condition variable, rather than a channel, because the
//! committer needs one thing a channel does not offer: to sleep until *N* requests are queued
//! (or a deadline passes) and be woken exactly once when that happens. Writers check the
//! committer's wake threshold when they enqueue, so while the committer is busy committing, or
//! waiting for more requests than are queued, enqueueing costs no wake-up at all.
//!
//! A semaphore bounds how many requests may be queued; writers beyond that wait asynchronously
//! for a slot (backpressure), never blocking a runtime thread.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use tokio::sync::Semaphore;

use super::Request;
use crate::{Result, StoreError};

pub(super) struct RequestQueue {
    state: Mutex<State>,
    ready: Condvar,
    slots: Semaphore,
}

struct State {
    items: VecDeque<Request>,
    /// Queue length at which an enqueuing writer must wake the committer; `usize::MAX` while
    /// the committer is not waiting.
    wake_at: usize,
    closed: bool,
}

impl RequestQueue {
    pub(super) fn new(depth: usize) -> Self {
        RequestQueue {
            state: Mutex::new(State {
                items: VecDeque::new(),
                wake_at: usize::MAX,
                closed: false,
            }),
            ready: Condvar::new(),
            slots: Semaphore::new(depth.max(1)),
        }
    }

    /// Enqueues `request`, waiting for room if the queue is full. Fails with `Closed` once the
    /// queue is closed (the request, and with it its reply channel, is then dropped).
    pub(super) async fn push(&self, request: Request) -> Result<()> {
        let permit = self.slots.acquire().await.map_err(|_| StoreError::Closed)?;
        // The slot is given back by the committer when it takes the request.
        permit.forget();
        let mut state = self.state.lock();
        if state.closed {
            drop(state);
            self.slots.add_permits(1);
            return Err(StoreError::Closed);
        }
        state.items.push_back(request);
        if state.items.len() >= state.wake_at {
            state.wake_at = usize::MAX;
            drop(state);
            self.ready.notify_one();
        }
        Ok(())
    }

    /// Requests currently queued.
    pub(super) fn len(&self) -> usize {
        self.state.lock().items.len()
    }

    /// Blocks until at least one request is queued; then, if fewer than `target` are, waits up
    /// to `linger` for that many. Moves up to `max` requests into `out`. Returns false once the
    /// queue is closed and empty.
    pub(super) fn next_batch(
        &self,
        out: &mut Vec<Request>,
        max: usize,
        target: usize,
        linger: Duration,
    ) -> bool {
        let mut state = self.state.lock();
        while state.items.is_empty() {
            if state.closed {
                return false;
            }
            state.wake_at = 1;
            self.ready.wait(&mut state);
        }
        let target = target.min(max);
        if state.items.len() < target && !linger.is_zero() {
            let deadline = Instant::now() + linger;
            while state.items.len() < target && !state.closed {
                state.wake_at = target;
                if self.ready.wait_until(&mut state, deadline).timed_out() {
                    break;
                }
            }
        }
        state.wake_at = usize::MAX;
        let n = state.items.len().min(max);
        out.extend(state.items.drain(..n));
        drop(state);
        self.slots.add_permits(n);
        true
    }

    /// Refuses further requests; the committer still receives those already queued.
    pub(super) fn close(&self) {
        self.state.lock().closed = true;
        self.slots.close();
        self.ready.notify_all();
    }

    /// Closes the queue and drops everything still in it, so that those callers see `Closed`.
    pub(super) fn close_and_discard(&self) {
        self.close();
        let discarded: Vec<Request> = self.state.lock().items.drain(..).collect();
        drop(discarded);
    }
}
