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

/// The changes of many batches as flat columns, ready to become Arrow arrays without a
/// per-change object: row `r` is the change at `locations[r]` (offset by its batch's base, so
/// that the batches of several engines can share one location table), with time
/// `times[time_offsets[r]..time_offsets[r + 1]]` and diff `diffs[r]`; batch `b` holds rows
/// `batch_offsets[b]..batch_offsets[b + 1]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Columns {
    pub batch_offsets: Vec<i32>,
    pub locations: Vec<u32>,
    pub time_offsets: Vec<i32>,
    pub times: Vec<i64>,
    pub diffs: Vec<i64>,
}

impl Default for Columns {
    fn default() -> Self {
        Columns { batch_offsets: vec![0], locations: vec![], time_offsets: vec![0], times: vec![], diffs: vec![] }
    }
}

/// Why [`Columns::extend`] refused a batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ColumnsError {
    /// A time coordinate above `i64::MAX` (Arrow's and Delta's times are signed).
    TimeTooLarge(u64),
    /// More rows or coordinates than 32-bit Arrow offsets address.
    TooLarge,
}

impl Columns {
    /// Appends one batch whose location indices are offset by `base`; on an error nothing is
    /// appended.
    pub fn extend(&mut self, changes: &Changes, base: u32) -> Result<(), ColumnsError> {
        if let Some(&big) = changes.flat_times().iter().find(|&&t| t > i64::MAX as u64) {
            return Err(ColumnsError::TimeTooLarge(big));
        }
        let rows = self.locations.len() + changes.len();
        let coordinates = self.times.len() + changes.flat_times().len();
        if rows > i32::MAX as usize || coordinates > i32::MAX as usize {
            return Err(ColumnsError::TooLarge);
        }
        let arity = changes.arity();
        for (index, &location) in changes.locations().iter().enumerate() {
            self.locations.push(location.checked_add(base).ok_or(ColumnsError::TooLarge)?);
            self.time_offsets.push((self.times.len() + (index + 1) * arity) as i32);
        }
        self.times.extend(changes.flat_times().iter().map(|&t| t as i64));
        self.diffs.extend_from_slice(changes.diffs());
        self.batch_offsets.push(rows as i32);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_concatenate_batches_of_any_arity() {
        let mut one = Changes::new(1);
        one.push(0, &[4], 1);
        one.push(2, &[5], -1);
        let mut two = Changes::new(2);
        two.push(1, &[1, 2], -1);
        let mut columns = Columns::default();
        columns.extend(&one, 0).unwrap();
        columns.extend(&Changes::new(1), 7).unwrap();
        columns.extend(&two, 10).unwrap();
        assert_eq!(columns.batch_offsets, vec![0, 2, 2, 3]);
        assert_eq!(columns.locations, vec![0, 2, 11]);
        assert_eq!(columns.time_offsets, vec![0, 1, 2, 4]);
        assert_eq!(columns.times, vec![4, 5, 1, 2]);
        assert_eq!(columns.diffs, vec![1, -1, -1]);
        let mut huge = Changes::new(1);
        huge.push(0, &[u64::MAX], 1);
        assert_eq!(columns.extend(&huge, 0), Err(ColumnsError::TimeTooLarge(u64::MAX)));
        assert_eq!(columns.locations.len(), 3, "a refused batch appends nothing");
    }

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
