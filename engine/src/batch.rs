//! A batch of frontier changes in flat, arity-agnostic storage.

/// Consolidated frontier changes, sorted by (time, location): per change a location index
/// (the caller's numbering), `arity` coordinates and a diff of `+1` or `-1`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Changes {
    arity: usize,
    locations: Vec<u32>,
    times: Vec<u64>,
    diffs: Vec<i64>,
}

impl Changes {
    /// An empty batch of times with `arity` coordinates.
    pub fn new(arity: usize) -> Self {
        Changes { arity, ..Changes::default() }
    }

    /// Appends one change.
    #[inline]
    pub fn push(&mut self, location: u32, time: &[u64], diff: i64) {
        debug_assert_eq!(time.len(), self.arity);
        self.locations.push(location);
        self.times.extend_from_slice(time);
        self.diffs.push(diff);
    }

    /// Empties the batch, keeping its memory.
    pub fn clear(&mut self) {
        self.locations.clear();
        self.times.clear();
        self.diffs.clear();
    }

    /// The number of coordinates of each time.
    pub fn arity(&self) -> usize {
        self.arity
    }

    /// The number of changes.
    pub fn len(&self) -> usize {
        self.locations.len()
    }

    /// True when nothing changed.
    pub fn is_empty(&self) -> bool {
        self.locations.is_empty()
    }

    /// The location of change `index`.
    #[inline]
    pub fn location(&self, index: usize) -> u32 {
        self.locations[index]
    }

    /// The time of change `index`.
    #[inline]
    pub fn time(&self, index: usize) -> &[u64] {
        &self.times[index * self.arity..(index + 1) * self.arity]
    }

    /// The diff of change `index`.
    #[inline]
    pub fn diff(&self, index: usize) -> i64 {
        self.diffs[index]
    }

    /// Every location, in order.
    pub fn locations(&self) -> &[u32] {
        &self.locations
    }

    /// Every time's coordinates, concatenated.
    pub fn flat_times(&self) -> &[u64] {
        &self.times
    }

    /// Every diff, in order.
    pub fn diffs(&self) -> &[i64] {
        &self.diffs
    }

    /// Iterates `(location, time, diff)`.
    pub fn iter(&self) -> impl Iterator<Item = (u32, &[u64], i64)> + '_ {
        (0..self.len()).map(move |i| (self.location(i), self.time(i), self.diff(i)))
    }

    /// The changes at locations that `keep` accepts, in the same order.
    pub fn filter(&self, keep: impl Fn(u32) -> bool) -> Changes {
        let mut out = Changes::new(self.arity);
        for (location, time, diff) in self.iter() {
            if keep(location) {
                out.push(location, time, diff);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flat_storage_round_trips() {
        let mut c = Changes::new(2);
        c.push(3, &[1, 2], 1);
        c.push(5, &[1, 3], -1);
        assert_eq!(c.len(), 2);
        assert_eq!(c.iter().collect::<Vec<_>>(), vec![(3, &[1u64, 2][..], 1), (5, &[1u64, 3][..], -1)]);
        let only = c.filter(|l| l == 5);
        assert_eq!(only.len(), 1);
        assert_eq!(only.time(0), &[1, 3]);
        c.clear();
        assert!(c.is_empty());
    }
}
