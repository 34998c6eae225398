//! The work pending at the time being settled: net diffs per location position.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// Diffs waiting at the current time, per internal position, taken in increasing position
/// order. Contributions to one position are summed in place, so each position is settled once.
#[derive(Debug, Default)]
pub struct Pending {
    queue: BinaryHeap<Reverse<u32>>,
    diffs: Vec<i64>,
    queued: Vec<bool>,
}

impl Pending {
    /// Room for positions `0..locations`.
    pub fn new(locations: usize) -> Self {
        Pending { queue: BinaryHeap::new(), diffs: vec![0; locations], queued: vec![false; locations] }
    }

    /// Adds `diff` at `position`.
    #[inline]
    pub fn add(&mut self, position: u32, diff: i64) {
        let index = position as usize;
        if !self.queued[index] {
            self.queued[index] = true;
            self.queue.push(Reverse(position));
        }
        self.diffs[index] += diff;
    }

    /// The least pending position and its net diff (possibly zero), or `None` when done.
    #[inline]
    pub fn pop(&mut self) -> Option<(usize, i64)> {
        let Reverse(position) = self.queue.pop()?;
        let index = position as usize;
        self.queued[index] = false;
        Some((index, std::mem::take(&mut self.diffs[index])))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_and_orders() {
        let mut pending = Pending::new(8);
        pending.add(5, 1);
        pending.add(2, -1);
        pending.add(5, 1);
        assert_eq!(pending.pop(), Some((2, -1)));
        pending.add(7, 1);
        pending.add(7, -1);
        assert_eq!(pending.pop(), Some((5, 2)));
        assert_eq!(pending.pop(), Some((7, 0)));
        assert_eq!(pending.pop(), None);
        pending.add(5, 3);
        assert_eq!(pending.pop(), Some((5, 3)));
    }
}
