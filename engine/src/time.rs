//! Logical times: product-ordered vectors of non-negative integers.
//!
//! The tracker is generic over [`Time`]; fixed-size arrays cover the common arities without
//! any allocation, and [`DynTime`] covers every other arity. `Ord` is the lexicographic order,
//! a linear extension of the product order that the propagation relies on.

use std::fmt::Debug;
use std::hash::Hash;

/// A timestamp as the tracker sees it: a vector of coordinates under the product order, plus
/// a total (lexicographic) order consistent with it.
pub trait Time: Clone + Ord + Hash + Debug + Send + Sync + 'static {
    /// Builds a time from its coordinates; `coords.len()` must be the tracker's arity.
    fn from_coords(coords: &[u64]) -> Self;
    /// The coordinates, outermost first.
    fn coords(&self) -> &[u64];
    /// The product order: `self <= other` in every coordinate.
    fn less_equal(&self, other: &Self) -> bool;
    /// Coordinate-wise sum (saturating), the building block of path summaries.
    fn plus(&self, increments: &Self) -> Self;
    /// True when every coordinate is zero.
    fn is_zero(&self) -> bool {
        self.coords().iter().all(|&c| c == 0)
    }
}

impl<const N: usize> Time for [u64; N] {
    #[inline]
    fn from_coords(coords: &[u64]) -> Self {
        let mut out = [0u64; N];
        out.copy_from_slice(coords);
        out
    }

    #[inline]
    fn coords(&self) -> &[u64] {
        self
    }

    #[inline]
    fn less_equal(&self, other: &Self) -> bool {
        self.iter().zip(other.iter()).all(|(a, b)| a <= b)
    }

    #[inline]
    fn plus(&self, increments: &Self) -> Self {
        let mut out = *self;
        for (o, i) in out.iter_mut().zip(increments.iter()) {
            *o = o.saturating_add(*i);
        }
        out
    }
}

/// A time of any arity, for the arities without a fixed-size specialisation.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct DynTime(Box<[u64]>);

impl Time for DynTime {
    fn from_coords(coords: &[u64]) -> Self {
        DynTime(coords.into())
    }

    fn coords(&self) -> &[u64] {
        &self.0
    }

    fn less_equal(&self, other: &Self) -> bool {
        self.0.iter().zip(other.0.iter()).all(|(a, b)| a <= b)
    }

    fn plus(&self, increments: &Self) -> Self {
        DynTime(self.0.iter().zip(increments.0.iter()).map(|(a, b)| a.saturating_add(*b)).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn product_order_and_lexicographic_order() {
        assert!([1u64, 2].less_equal(&[1, 3]));
        assert!(![2u64, 0].less_equal(&[1, 2]));
        assert!([1u64, 5] < [2, 0]); // lexicographic: a linear extension
        let a = DynTime::from_coords(&[1, 2, 3, 4, 5]);
        let b = DynTime::from_coords(&[1, 2, 3, 4, 6]);
        assert!(a.less_equal(&b) && a < b);
        assert_eq!(a.plus(&b).coords(), &[2, 4, 6, 8, 11]);
        assert_eq!([u64::MAX].plus(&[1]), [u64::MAX]);
        assert!([0u64, 0].is_zero() && ![0u64, 1].is_zero());
    }
}
