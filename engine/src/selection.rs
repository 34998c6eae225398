//! A set of locations, as a bit set: what one subscriber wants to hear about.

/// A subset of the locations `0..len`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Selection {
    len: usize,
    bits: Vec<u64>,
}

impl Selection {
    /// The empty selection over `len` locations.
    pub fn empty(len: usize) -> Self {
        Selection { len, bits: vec![0; len.div_ceil(64)] }
    }

    /// The locations `members` out of `len`; `Err(index)` names the first one out of range.
    pub fn new(len: usize, members: impl IntoIterator<Item = usize>) -> Result<Self, usize> {
        let mut out = Selection::empty(len);
        for location in members {
            if location >= len {
                return Err(location);
            }
            out.bits[location / 64] |= 1 << (location % 64);
        }
        Ok(out)
    }

    /// The size of the universe the selection is drawn from.
    pub fn universe(&self) -> usize {
        self.len
    }

    /// True iff `location` is selected.
    #[inline]
    pub fn contains(&self, location: u32) -> bool {
        let location = location as usize;
        location < self.len && self.bits[location / 64] & (1 << (location % 64)) != 0
    }

    /// The selected locations, ascending.
    pub fn members(&self) -> Vec<usize> {
        (0..self.len).filter(|&l| self.contains(l as u32)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn membership() {
        let s = Selection::new(130, [0, 64, 129]).unwrap();
        assert!(s.contains(0) && s.contains(64) && s.contains(129));
        assert!(!s.contains(1) && !s.contains(130) && !s.contains(9999));
        assert_eq!(s.members(), vec![0, 64, 129]);
        assert_eq!(Selection::new(3, [1, 3]), Err(3));
    }
}
