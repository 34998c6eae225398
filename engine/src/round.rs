//! Work gathered per location: lists of `(time, diff)` per internal position, taken in
//! increasing position order.
//!
//! The tracker uses it twice: to stage a batch's pointstamp updates per location (so that each
//! location's counts take them in one [`crate::antichain::Antichain::update_batch`]), and for a
//! propagation round that settles several incomparable times at once, where each position must
//! be settled once with every contribution of every time of the round.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

const NONE: u32 = u32::MAX;

/// Per position, a list of `(time, diff)`; positions are taken least first.
#[derive(Debug)]
pub struct Round<T> {
    queue: BinaryHeap<Reverse<u32>>,
    /// Per position: the index of its list in `lists`, or `NONE`.
    slots: Vec<u32>,
    lists: Vec<Vec<(T, i64)>>,
    /// Indices of `lists` not in use (emptied, kept for their memory).
    free: Vec<u32>,
}

impl<T> Round<T> {
    /// Room for positions `0..locations`, nothing gathered.
    pub fn new(locations: usize) -> Self {
        Round { queue: BinaryHeap::new(), slots: vec![NONE; locations], lists: Vec::new(), free: Vec::new() }
    }

    /// Adds `(time, diff)` to the list of `position`.
    #[inline]
    pub fn add(&mut self, position: u32, time: T, diff: i64) {
        let slot = &mut self.slots[position as usize];
        if *slot == NONE {
            *slot = match self.free.pop() {
                Some(index) => index,
                None => {
                    self.lists.push(Vec::new());
                    (self.lists.len() - 1) as u32
                }
            };
            self.queue.push(Reverse(position));
        }
        self.lists[*slot as usize].push((time, diff));
    }

    /// True when nothing is gathered.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// The least position with a list, its list moved into `out` (whose previous contents are
    /// dropped and whose memory the round keeps), or `None` when nothing is left.
    #[inline]
    pub fn pop_into(&mut self, out: &mut Vec<(T, i64)>) -> Option<usize> {
        let Reverse(position) = self.queue.pop()?;
        let slot = std::mem::replace(&mut self.slots[position as usize], NONE);
        out.clear();
        std::mem::swap(out, &mut self.lists[slot as usize]);
        self.free.push(slot);
        Some(position as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_per_position_in_order() {
        let mut round = Round::new(8);
        round.add(5, 'a', 1);
        round.add(2, 'b', -1);
        round.add(5, 'c', 2);
        let mut out = vec![('z', 9)];
        assert_eq!(round.pop_into(&mut out), Some(2));
        assert_eq!(out, vec![('b', -1)]);
        round.add(7, 'd', 1);
        round.add(2, 'e', 1); // a position already taken comes back
        assert_eq!(round.pop_into(&mut out), Some(2));
        assert_eq!(out, vec![('e', 1)]);
        assert_eq!(round.pop_into(&mut out), Some(5));
        assert_eq!(out, vec![('a', 1), ('c', 2)]);
        assert_eq!(round.pop_into(&mut out), Some(7));
        assert_eq!(out, vec![('d', 1)]);
        assert_eq!(round.pop_into(&mut out), None);
        assert!(round.is_empty());
        assert!(round.lists.len() <= 3, "emptied lists are reused");
    }
}
