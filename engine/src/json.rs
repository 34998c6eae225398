//! The JSON `changes` payload, encoded in one pass from per-location fragments.
//!
//! A change encodes as `{"location": FRAGMENT, "time": [c, ...], "diff": 1}`, where FRAGMENT is
//! the caller's JSON text for the location, registered once. Two layouts: Python's
//! `json.dumps` default separators (`", "` and `": "`), with each fragment as given, or the
//! compact ones (`","`, `":"`), with each fragment stripped of whitespace outside strings.

use crate::batch::Changes;
use crate::selection::Selection;

/// Per location, the text up to the time's first coordinate, in both layouts.
#[derive(Clone, Debug)]
pub struct Fragments {
    spaced: Vec<Box<str>>,
    compact: Vec<Box<str>>,
    /// The length of the longest of them.
    longest: usize,
}

impl Fragments {
    /// Fragments for locations `0..fragments.len()`; each is the JSON of that location.
    pub fn new<S: AsRef<str>>(fragments: &[S]) -> Self {
        let spaced: Vec<Box<str>> =
            fragments.iter().map(|f| format!("{{\"location\": {}, \"time\": [", f.as_ref()).into()).collect();
        let compact =
            fragments.iter().map(|f| format!("{{\"location\":{},\"time\":[", minify(f.as_ref())).into()).collect();
        let longest = spaced.iter().map(|f| f.len()).max().unwrap_or(0); // the compact ones are no longer
        Fragments { spaced, compact, longest }
    }

    /// The number of locations.
    pub fn len(&self) -> usize {
        self.spaced.len()
    }

    /// True when there are none.
    pub fn is_empty(&self) -> bool {
        self.spaced.is_empty()
    }

    /// The compact text of location `index` up to its next key: `{"location":FRAGMENT,`.
    pub fn location_prefix(&self, index: usize) -> &str {
        let prefix: &str = &self.compact[index];
        &prefix[..prefix.len() - "\"time\":[".len()]
    }

    /// At least the length in bytes of what [`Fragments::encode`] appends for `changes` (a
    /// bound from the longest fragment, so that the output is allocated once, not grown).
    pub fn encoded_len_bound(&self, changes: &Changes) -> usize {
        let per_time = changes.arity() * (u64::MAX.ilog10() as usize + 3); // digits and a separator
        let per_change = self.longest + per_time + "], \"diff\": -}, ".len() + i64::MAX.ilog10() as usize + 1;
        2 + changes.len() * per_change
    }

    /// Appends the JSON array of `changes` (only those whose location `selection` holds, if
    /// given) to `out`. Every location of `changes` must have a fragment.
    pub fn encode(&self, changes: &Changes, selection: Option<&Selection>, compact: bool, out: &mut String) {
        let (prefixes, item_sep, coord_sep, tail) = if compact {
            (&self.compact, ",", ",", "],\"diff\":")
        } else {
            (&self.spaced, ", ", ", ", "], \"diff\": ")
        };
        let mut numbers = itoa::Buffer::new();
        out.push('[');
        let mut first = true;
        for (location, time, diff) in changes.iter() {
            if let Some(selection) = selection {
                if !selection.contains(location) {
                    continue;
                }
            }
            if !first {
                out.push_str(item_sep);
            }
            first = false;
            out.push_str(&prefixes[location as usize]);
            for (index, coord) in time.iter().enumerate() {
                if index > 0 {
                    out.push_str(coord_sep);
                }
                out.push_str(numbers.format(*coord));
            }
            out.push_str(tail);
            out.push_str(numbers.format(diff));
            out.push('}');
        }
        out.push(']');
    }
}

/// `json` without whitespace outside strings.
fn minify(json: &str) -> String {
    let mut out = String::with_capacity(json.len());
    let (mut in_string, mut escaped) = (false, false);
    for c in json.chars() {
        if in_string {
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_string = false;
            }
        } else if c == '"' {
            in_string = true;
        } else if c.is_ascii_whitespace() {
            continue;
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_layouts() {
        let fragments = Fragments::new(&["{\"node\": 0}", "{\"node\": 1}"]);
        let mut changes = Changes::new(2);
        changes.push(1, &[7, 0], 1);
        changes.push(0, &[8, 12], -1);
        let mut out = String::new();
        fragments.encode(&changes, None, false, &mut out);
        assert_eq!(
            out,
            "[{\"location\": {\"node\": 1}, \"time\": [7, 0], \"diff\": 1}, \
             {\"location\": {\"node\": 0}, \"time\": [8, 12], \"diff\": -1}]"
        );
        out.clear();
        let only = Selection::new(2, [0]).unwrap();
        fragments.encode(&changes, Some(&only), true, &mut out);
        assert_eq!(out, "[{\"location\":{\"node\":0},\"time\":[8,12],\"diff\":-1}]");
        assert_eq!(minify("{\"a b\": [1, \"x\\\" y\"]}"), "{\"a b\":[1,\"x\\\" y\"]}");
        out.clear();
        fragments.encode(&Changes::new(2), None, true, &mut out);
        assert_eq!(out, "[]");
    }

    #[test]
    fn encoded_len_bound_holds() {
        let fragments = Fragments::new(&["{\"node\": 0}", "{\"node\": 12, \"kind\": \"a b\"}", "{}"]);
        let mut changes = Changes::new(2);
        for (index, value) in [0u64, 9, 10, 99, 100, 12345, u64::MAX].into_iter().enumerate() {
            changes.push(index as u32 % 3, &[value, u64::MAX], if index % 2 == 0 { 1 } else { i64::MIN });
        }
        for compact in [false, true] {
            let mut out = String::new();
            fragments.encode(&changes, None, compact, &mut out);
            assert!(fragments.encoded_len_bound(&changes) >= out.len(), "{out}");
        }
        assert!(fragments.encoded_len_bound(&Changes::new(2)) >= 2);
    }
}
