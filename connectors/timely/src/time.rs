//! Timely timestamps as the service's times: vectors of non-negative integers, product-ordered.
//!
//! The service orders times coordinate-wise and adds summaries coordinate-wise. A timely
//! timestamp maps onto that exactly when its order is the product order of its parts and its
//! summaries add part by part: unsigned integers (one coordinate) and [`Product`] of such
//! types (the outer coordinates, then the inner ones). [`ServiceTimestamp`] is implemented for
//! exactly those, so a program declaring another time type with
//! [`Attach::timestamp`](crate::Attach::timestamp) does not compile.
//!
//! Refused on purpose:
//! * tuples `(A, B)`: timely orders them lexicographically (`(0, 9) < (1, 0)`), which no
//!   product order of integer vectors expresses; mapping them coordinate-wise would let the
//!   service call `(1, 0)` complete while `(0, 9)` is still live, an early notification. Use
//!   `Product` when the order is meant to be partial, or one integer when it is total.
//! * signed integers and `Duration`: the service's coordinates are non-negative integers, and
//!   summaries of at most `2^31 - 1` would cap a `Duration` delay at about two seconds.
//! * `()`: a dataflow with no time has no progress to track.

use std::any::type_name;

use timely::order::Product;
use timely::progress::Timestamp;

/// The largest coordinate the service accepts in a time; larger ones are sent as this value.
///
/// Sending a smaller time than timely's only holds frontiers back (a pointstamp at `MAX_TIME`
/// blocks everything at or beyond it), so it can delay the service's view but never make it
/// early; times that large are in practice sentinels ("never"), reached by no capability.
pub const MAX_TIME: u64 = (1 << 62) - 1;

/// The largest coordinate of a path summary the service accepts.
pub const MAX_SUMMARY: u64 = (1 << 31) - 1;

/// What the connector needs to know of a timestamp type, at run time, to relate scopes.
///
/// Scopes are told apart by the types their events are logged under: a child scope whose time
/// has the parent's name is a region, one whose time is `Product<parent, one coordinate>` is
/// an iterative scope.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TimeShape {
    /// `std::any::type_name` of the timestamp, as timely's logger names carry it.
    pub name: &'static str,
    /// Coordinates in the service's time.
    pub arity: usize,
    /// For `Product<Outer, Inner>`: `Outer`'s name and `Inner`'s arity.
    pub product_of: Option<(&'static str, usize)>,
}

/// A timely timestamp type the service can hold exactly (see the module's documentation).
///
/// Guarantees: `coordinates` is order-preserving and order-reflecting (`a.less_equal(b)` iff
/// the coordinates of `a` are coordinate-wise at most those of `b`), and a summary's
/// coordinates added to a time's coordinates give the coordinates of `summary.results_in(time)`
/// whenever timely's addition does not overflow.
///
/// ```
/// use timely::order::Product;
/// use timely_progress_service::ServiceTimestamp;
///
/// let mut out = Vec::new();
/// Product::new(7u64, 2u32).coordinates(&mut out);
/// assert_eq!(out, vec![7, 2]);
/// assert_eq!(<Product<u64, u32> as ServiceTimestamp>::ARITY, 2);
/// ```
pub trait ServiceTimestamp: Timestamp {
    /// Number of coordinates.
    const ARITY: usize;
    /// Appends this time's coordinates to `out`.
    fn coordinates(&self, out: &mut Vec<u64>);
    /// Appends a summary's coordinates (one increment per coordinate) to `out`.
    fn summary_coordinates(summary: &Self::Summary, out: &mut Vec<u64>);
    /// The type's shape, for relating a scope's time to its parent's.
    fn shape() -> TimeShape {
        TimeShape { name: type_name::<Self>(), arity: Self::ARITY, product_of: None }
    }
}

macro_rules! unsigned {
    ($($t:ty),*) => {$(
        impl ServiceTimestamp for $t {
            const ARITY: usize = 1;
            #[inline]
            fn coordinates(&self, out: &mut Vec<u64>) {
                out.push(*self as u64);
            }
            #[inline]
            fn summary_coordinates(summary: &$t, out: &mut Vec<u64>) {
                out.push(*summary as u64);
            }
        }
    )*};
}

unsigned!(u8, u16, u32, u64, usize);

impl<A: ServiceTimestamp, B: ServiceTimestamp> ServiceTimestamp for Product<A, B> {
    const ARITY: usize = A::ARITY + B::ARITY;
    #[inline]
    fn coordinates(&self, out: &mut Vec<u64>) {
        self.outer.coordinates(out);
        self.inner.coordinates(out);
    }
    #[inline]
    fn summary_coordinates(summary: &Self::Summary, out: &mut Vec<u64>) {
        A::summary_coordinates(&summary.outer, out);
        B::summary_coordinates(&summary.inner, out);
    }
    fn shape() -> TimeShape {
        TimeShape { name: type_name::<Self>(), arity: Self::ARITY, product_of: Some((type_name::<A>(), B::ARITY)) }
    }
}

/// How a scope's time relates to its parent's, as the service models scopes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ScopeKind {
    /// The dataflow itself.
    Root,
    /// Same time as the parent (`region`).
    Region,
    /// The parent's time and one loop coordinate (`iterative`).
    Iterative,
}

/// The kind of a scope whose time is `child` inside a scope whose time is `parent`, or why the
/// service cannot express it.
pub fn scope_kind(parent: &TimeShape, child: &TimeShape) -> Result<ScopeKind, String> {
    if child.name == parent.name {
        return Ok(ScopeKind::Region);
    }
    match child.product_of {
        Some((outer, 1)) if outer == parent.name => Ok(ScopeKind::Iterative),
        Some((outer, n)) if outer == parent.name => Err(format!(
            "its time {} adds {n} coordinates to its parent's {}; the service's iterative scopes add one",
            child.name, parent.name
        )),
        _ => Err(format!(
            "its time {} neither equals its parent's {} (a region) nor is Product<{}, _> (an iterative scope)",
            child.name, parent.name, parent.name
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use timely::order::PartialOrder;

    fn coords<T: ServiceTimestamp>(t: &T) -> Vec<u64> {
        let mut out = Vec::new();
        t.coordinates(&mut out);
        out
    }

    #[test]
    fn product_order_is_preserved_and_reflected() {
        let times: Vec<Product<u64, u32>> = (0..3).flat_map(|a| (0..3).map(move |b| Product::new(a, b))).collect();
        for a in &times {
            for b in &times {
                let (ca, cb) = (coords(a), coords(b));
                let product = ca.iter().zip(&cb).all(|(x, y)| x <= y);
                assert_eq!(a.less_equal(b), product, "{a:?} {b:?}");
            }
        }
    }

    #[test]
    fn kinds_follow_the_types() {
        let root = <u64 as ServiceTimestamp>::shape();
        let iterative = <Product<u64, u32> as ServiceTimestamp>::shape();
        let twice = <Product<Product<u64, u32>, u64> as ServiceTimestamp>::shape();
        let two_at_once = <Product<u64, Product<u32, u32>> as ServiceTimestamp>::shape();
        assert_eq!(scope_kind(&root, &root), Ok(ScopeKind::Region));
        assert_eq!(scope_kind(&root, &iterative), Ok(ScopeKind::Iterative));
        assert_eq!(scope_kind(&iterative, &twice), Ok(ScopeKind::Iterative));
        assert!(scope_kind(&root, &two_at_once).unwrap_err().contains("adds 2 coordinates"));
        assert!(scope_kind(&iterative, &root).is_err());
        assert_eq!(twice.arity, 3);
    }
}
