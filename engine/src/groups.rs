//! Frontier changes collected during propagation, grouped by time, drained in output order.
//!
//! Propagation settles times in increasing order, so a batch's changes fall into few distinct
//! times; within one time they are recorded in propagation order, not location order. Keeping
//! one small list per time and sorting only location keys (plain integers) is much cheaper
//! than sorting `(time, location, diff)` triples.

use crate::batch::Changes;
use crate::time::Time;

/// Changes per distinct time, each as an integer key `location << 32 | diff as u32`.
#[derive(Debug)]
pub struct TimeGroups<T> {
    /// Sorted by time.
    groups: Vec<(T, Vec<u64>)>,
    /// Emptied lists, kept for their memory.
    spare: Vec<Vec<u64>>,
    /// The group touched last: most changes in a row share a time, or follow in time order.
    last: usize,
    /// Net diff per location, for groups dense enough to place rather than sort; all zero
    /// between uses.
    dense: Vec<i64>,
}

impl<T> Default for TimeGroups<T> {
    fn default() -> Self {
        TimeGroups { groups: Vec::new(), spare: Vec::new(), last: 0, dense: Vec::new() }
    }
}

impl<T: Time> TimeGroups<T> {
    /// Nothing collected.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records that `time` entered (`diff > 0`) or left (`diff < 0`) `location`'s frontier;
    /// `diff` fits 32 bits (the antichains report `+1` and `-1`).
    #[inline(always)]
    pub fn push(&mut self, time: T, location: u32, diff: i64) {
        debug_assert!(i32::try_from(diff).is_ok());
        let key = (u64::from(location) << 32) | u64::from(diff as i32 as u32);
        if let Some((at, keys)) = self.groups.get_mut(self.last) {
            if *at == time {
                keys.push(key);
                return;
            }
        }
        // A location of a round of many times reports its changes in time order: the next
        // change is usually at the next group.
        if let Some((at, keys)) = self.groups.get_mut(self.last + 1) {
            if *at == time {
                keys.push(key);
                self.last += 1;
                return;
            }
        }
        match self.groups.binary_search_by(|(at, _)| at.cmp(&time)) {
            Ok(index) => {
                self.last = index;
                self.groups[index].1.push(key);
            }
            Err(index) => {
                let mut keys = self.spare.pop().unwrap_or_default();
                keys.push(key);
                self.groups.insert(index, (time, keys));
                self.last = index;
            }
        }
    }

    /// Appends the consolidated changes to `out`, sorted by (time, location), dropping the
    /// ones that cancelled out, and empties the groups.
    pub fn drain_into(&mut self, out: &mut Changes) {
        for (time, mut keys) in self.groups.drain(..) {
            let (low, high) = keys.iter().fold((u64::MAX, 0), |(lo, hi), k| (lo.min(k >> 32), hi.max(k >> 32)));
            let span = (high - low + 1) as usize;
            if keys.len() >= 32 && span <= 4 * keys.len() {
                // Dense (a batch moving many frontiers): place each diff at its location and
                // sweep the span once, instead of sorting.
                let dense = &mut self.dense;
                if dense.len() < span {
                    dense.resize(span, 0);
                }
                for key in &keys {
                    dense[((key >> 32) - low) as usize] += i64::from(*key as u32 as i32);
                }
                for (offset, diff) in dense[..span].iter_mut().enumerate() {
                    if *diff != 0 {
                        out.push((low as usize + offset) as u32, time.coords(), *diff);
                        *diff = 0;
                    }
                }
                keys.clear();
                self.spare.push(keys);
                continue;
            }
            keys.sort_unstable();
            let mut index = 0;
            while index < keys.len() {
                let location = keys[index] >> 32;
                let mut diff = 0i64;
                while index < keys.len() && keys[index] >> 32 == location {
                    diff += i64::from(keys[index] as u32 as i32);
                    index += 1;
                }
                if diff != 0 {
                    out.push(location as u32, time.coords(), diff);
                }
            }
            keys.clear();
            self.spare.push(keys);
        }
        self.last = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sorted_and_consolidated() {
        let mut groups = TimeGroups::new();
        groups.push([5u64], 3, 1);
        groups.push([2u64], 9, -1);
        groups.push([5u64], 1, -1);
        groups.push([2u64], 4, 1);
        groups.push([5u64], 3, -1); // cancels the first
        groups.push([7u64], 0, 1);
        let mut out = Changes::new(1);
        groups.drain_into(&mut out);
        let got: Vec<_> = out.iter().map(|(l, t, d)| (l, t[0], d)).collect();
        assert_eq!(got, vec![(4, 2, 1), (9, 2, -1), (1, 5, -1), (0, 7, 1)]);
        groups.push([1u64], 2, 1);
        out.clear();
        groups.drain_into(&mut out);
        assert_eq!(out.len(), 1);
    }

    #[test]
    fn dense_groups_are_placed_not_sorted() {
        let mut groups = TimeGroups::new();
        let locations: Vec<u32> = (0..100).map(|i| (i * 37) % 100 + 10).collect();
        for &l in &locations {
            groups.push([1u64], l, if l % 2 == 0 { 1 } else { -1 });
        }
        groups.push([1u64], 20, -1); // cancels
        let mut out = Changes::new(1);
        groups.drain_into(&mut out);
        let expected: Vec<(u32, i64)> =
            (10..110).filter(|&l| l != 20).map(|l| (l, if l % 2 == 0 { 1 } else { -1 })).collect();
        assert_eq!(out.iter().map(|(l, _, d)| (l, d)).collect::<Vec<_>>(), expected);
        assert!(groups.dense.iter().all(|&d| d == 0));
    }
}
