//! The bounded hand-over between a worker and its background sender.
//!
//! The worker never waits here: [`Outbox::push`] appends under a mutex held for a few
//! instructions. Past [`Outbox::BOUND`] queued updates (the sender stuck in a slow request),
//! further sends are folded into one consolidated message instead, whose size is bounded by
//! the number of distinct live pointstamps rather than by the number of updates (a message
//! sent and received cancels out). Folding consecutive sends of one worker into one atomic
//! batch is safe: it only skips intermediate states, it never reorders updates.

use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::graph::DataflowGraph;
use crate::mapping::{consolidate_into, Counts, RawKey, RawSends};
use crate::stats::Activity;

/// What a worker hands to its sender.
pub(crate) enum Message {
    /// A dataflow was built: register it (worker 0) or find it (the others).
    Register(Box<DataflowGraph>),
    /// Progress messages, in the order timely sent them.
    Sends(RawSends),
    /// Progress folded while the queue was full, consolidated.
    Folded(Counts<RawKey>),
    /// An interval's statistics (or several, merged while the sender was behind).
    Activity(Activity),
}

#[derive(Default)]
struct State {
    messages: Vec<Message>,
    queued: usize,
    closed: bool,
    folded: u64,
    busy: bool,
}

/// The queue between one worker and its sender thread.
#[derive(Default)]
pub(crate) struct Outbox {
    state: Mutex<State>,
    wake: Condvar,
}

impl Outbox {
    /// Queued updates beyond which sends are folded.
    pub(crate) const BOUND: usize = 1 << 20;

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Queues a message of `updates` updates; never blocks on the sender.
    pub(crate) fn push(&self, message: Message, updates: usize) {
        let mut state = self.lock();
        let was_empty = state.messages.is_empty();
        match message {
            Message::Sends(sends) if state.queued + updates > Self::BOUND => {
                if !matches!(state.messages.last(), Some(Message::Folded(_))) {
                    state.messages.push(Message::Folded(Counts::default()));
                }
                let Some(Message::Folded(folded)) = state.messages.last_mut() else { unreachable!() };
                consolidate_into(&sends, folded);
                state.folded += updates as u64;
            }
            Message::Activity(activity) => {
                // At most one queued: a sender behind (the service slow) merges intervals.
                match state.messages.iter_mut().rev().find_map(|m| match m {
                    Message::Activity(queued) => Some(queued),
                    _ => None,
                }) {
                    Some(queued) => {
                        for (dataflow, counted) in activity {
                            queued.entry(dataflow).or_default().merge(counted);
                        }
                    }
                    None => state.messages.push(Message::Activity(activity)),
                }
            }
            message => {
                state.queued += updates;
                state.messages.push(message);
            }
        }
        drop(state);
        if was_empty {
            self.wake.notify_one();
        }
    }

    /// The worker is gone: nothing more will come.
    pub(crate) fn close(&self) {
        self.lock().closed = true;
        self.wake.notify_one();
    }

    /// Waits until something is queued, or `deadline` passes, or (without a deadline) the
    /// outbox is closed; then, after lingering up to `linger` for more (fewer, larger
    /// batches), takes everything queued. Answers the messages and whether it is closed.
    pub(crate) fn take(&self, deadline: Option<Instant>, linger: Duration) -> (Vec<Message>, bool) {
        let mut state = self.lock();
        // Closed, the outbox has nothing more to wait for, but a retry deadline still does.
        while state.messages.is_empty() && !(state.closed && deadline.is_none()) {
            match deadline {
                None => state = self.wake.wait(state).unwrap_or_else(|p| p.into_inner()),
                Some(deadline) => {
                    let now = Instant::now();
                    if now >= deadline {
                        break;
                    }
                    state = self.wake.wait_timeout(state, deadline - now).unwrap_or_else(|p| p.into_inner()).0;
                }
            }
        }
        if !state.messages.is_empty() && !state.closed && !linger.is_zero() {
            // Woken early only by the worker's end (pushes notify an empty queue only), so
            // the last batch does not wait out the linger.
            state = self.wake.wait_timeout_while(state, linger, |s| !s.closed).unwrap_or_else(|p| p.into_inner()).0;
        }
        state.queued = 0;
        state.busy |= !state.messages.is_empty();
        (std::mem::take(&mut state.messages), state.closed)
    }

    /// Updates folded so far because the queue was full.
    pub(crate) fn folded(&self) -> u64 {
        self.lock().folded
    }

    /// Whether the worker is gone.
    pub(crate) fn is_closed(&self) -> bool {
        self.lock().closed
    }

    /// Whether nothing is queued.
    pub(crate) fn is_empty(&self) -> bool {
        self.lock().messages.is_empty()
    }

    /// The sender says whether everything it took is delivered (or given up).
    pub(crate) fn settle(&self, delivered: bool) {
        self.lock().busy = !delivered;
    }

    /// Whether everything handed over so far is delivered: nothing queued, nothing in hand.
    pub(crate) fn quiet(&self) -> bool {
        let state = self.lock();
        state.messages.is_empty() && !state.busy
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sends(updates: &[(u64, i64)]) -> RawSends {
        let mut sends = RawSends::default();
        for (time, delta) in updates {
            sends.push(7, 1, 0, true, *delta, |out| out.push(*time));
        }
        sends
    }

    #[test]
    fn past_the_bound_sends_fold_into_one_consolidated_message() {
        let outbox = Outbox::default();
        outbox.push(Message::Sends(sends(&[(0, -1)])), Outbox::BOUND);
        // The queue is full: these fold, and a capability moved on and back cancels out.
        outbox.push(Message::Sends(sends(&[(1, 1), (0, 1)])), 2);
        outbox.push(Message::Sends(sends(&[(1, -1), (2, 1)])), 2);
        assert_eq!(outbox.folded(), 4);
        let (messages, closed) = outbox.take(Some(Instant::now()), Duration::ZERO);
        assert!(!closed);
        assert_eq!(messages.len(), 2);
        let Message::Folded(folded) = &messages[1] else { panic!("folded second") };
        let net: Vec<(u64, i64)> = {
            let mut v: Vec<_> = folded.iter().map(|(k, d)| (k.time.as_slice()[0], *d)).collect();
            v.sort();
            v
        };
        assert_eq!(net, vec![(0, 1), (2, 1)]);
        // Taken: the queue is empty again, and pushes queue normally.
        outbox.push(Message::Sends(sends(&[(3, 1)])), 1);
        assert!(matches!(outbox.take(None, Duration::ZERO).0.as_slice(), [Message::Sends(_)]));
    }

    #[test]
    fn statistics_queued_behind_a_slow_sender_merge_into_one_message() {
        use crate::stats::{Activity, DataflowActivity};
        let outbox = Outbox::default();
        let interval = |records: i64| -> Activity {
            let mut d = DataflowActivity { seconds: 1.0, ..DataflowActivity::default() };
            d.channels.insert((vec![], (1, 0), (2, 0)), (1, records));
            [(0, d)].into_iter().collect()
        };
        outbox.push(Message::Activity(interval(3)), 0);
        outbox.push(Message::Sends(sends(&[(0, -1)])), 1);
        outbox.push(Message::Activity(interval(4)), 0);
        let (messages, _) = outbox.take(Some(Instant::now()), Duration::ZERO);
        assert_eq!(messages.len(), 2, "one statistics message, one of progress");
        let Message::Activity(merged) = &messages[0] else { panic!("statistics first") };
        assert_eq!((merged[&0].seconds, merged[&0].channels[&(vec![], (1, 0), (2, 0))]), (2.0, (2, 7)));
    }

    #[test]
    fn the_worker_ending_cuts_the_linger_short() {
        let outbox = std::sync::Arc::new(Outbox::default());
        outbox.push(Message::Sends(sends(&[(0, -1)])), 1);
        let closer = std::sync::Arc::clone(&outbox);
        let started = Instant::now();
        let handle = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            closer.close();
        });
        let (messages, closed) = outbox.take(None, Duration::from_secs(60));
        handle.join().expect("the closing thread");
        assert!(closed && messages.len() == 1);
        assert!(started.elapsed() < Duration::from_secs(30), "waited out the linger: {:?}", started.elapsed());
    }
}
