//! Where the members of a JSON object are, and the elements of some of its array members, found
//! without building anything: what lets the service parse a multi-megabyte registration body a
//! slice of nodes at a time, without the GIL for the scan.
//!
//! The scan checks the object's structure (brackets, commas, colons, strings' ends, only JSON
//! whitespace between tokens) at the top level and between the elements of the arrays it
//! splits; it skips the insides of values, counting brackets and strings. The caller decodes the
//! keys, the other values and the elements (a slice of consecutive elements at a time) with a
//! real JSON parser, which checks the rest: so a document is accepted iff it is JSON.

/// One member of the object: byte ranges `[start, end)` of its key (quotes included) and of
/// its value, and, for an array value whose key was asked for, the range of each element.
#[derive(Debug, PartialEq)]
pub struct Member {
    pub key: (usize, usize),
    pub value: (usize, usize),
    pub elements: Option<Vec<(usize, usize)>>,
}

fn skip_space(data: &[u8], mut at: usize) -> usize {
    while at < data.len() && matches!(data[at], b' ' | b'\t' | b'\n' | b'\r') {
        at += 1;
    }
    at
}

/// Just past the string starting at `at` (a `"`), or `None` if it does not end.
fn string_end(data: &[u8], mut at: usize) -> Option<usize> {
    at += 1;
    while at < data.len() {
        match data[at] {
            b'\\' => at += 2,
            b'"' => return Some(at + 1),
            _ => at += 1,
        }
    }
    None
}

/// Just past the value starting at `at`: a string, a bracketed value (its brackets counted, its
/// strings skipped) or a scalar (up to the next delimiter), or `None` if it does not end.
fn value_end(data: &[u8], at: usize) -> Option<usize> {
    match *data.get(at)? {
        b'"' => string_end(data, at),
        b'{' | b'[' => {
            let mut depth = 0usize;
            let mut i = at;
            while i < data.len() {
                match data[i] {
                    b'"' => {
                        i = string_end(data, i)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(i + 1);
                        }
                    }
                    _ => {}
                }
                i += 1;
            }
            None
        }
        b',' | b'}' | b']' | b':' | b' ' | b'\t' | b'\n' | b'\r' => None,
        _ => {
            let mut i = at;
            while i < data.len() && !matches!(data[i], b',' | b'}' | b']' | b':' | b' ' | b'\t' | b'\n' | b'\r') {
                i += 1;
            }
            Some(i)
        }
    }
}

/// The elements of the array starting at `at` (a `[`) and the position just past it.
fn elements(data: &[u8], at: usize) -> Option<(Vec<(usize, usize)>, usize)> {
    let mut found = Vec::new();
    let mut i = skip_space(data, at + 1);
    if data.get(i) == Some(&b']') {
        return Some((found, i + 1));
    }
    loop {
        let end = value_end(data, i)?;
        found.push((i, end));
        i = skip_space(data, end);
        match data.get(i)? {
            b',' => i = skip_space(data, i + 1),
            b']' => return Some((found, i + 1)),
            _ => return None,
        }
    }
}

/// The members of the object that `data` is (JSON whitespace around it), with the elements of
/// the array values of the keys in `split` (compared as written, between the quotes); `None`
/// if `data` is not an object or its structure is broken where the scan looks.
pub fn members(data: &[u8], split: &[&[u8]]) -> Option<Vec<Member>> {
    let mut found = Vec::new();
    let mut i = skip_space(data, 0);
    if data.get(i) != Some(&b'{') {
        return None;
    }
    i = skip_space(data, i + 1);
    if data.get(i) == Some(&b'}') {
        return (skip_space(data, i + 1) == data.len()).then_some(found);
    }
    loop {
        if data.get(i) != Some(&b'"') {
            return None;
        }
        let key = (i, string_end(data, i)?);
        i = skip_space(data, key.1);
        if data.get(i) != Some(&b':') {
            return None;
        }
        let start = skip_space(data, i + 1);
        let wanted = split.contains(&&data[key.0 + 1..key.1 - 1]);
        let (end, elements) = if wanted && data.get(start) == Some(&b'[') {
            let (elements, end) = elements(data, start)?;
            (end, Some(elements))
        } else {
            (value_end(data, start)?, None)
        };
        found.push(Member { key, value: (start, end), elements });
        i = skip_space(data, end);
        match data.get(i)? {
            b',' => i = skip_space(data, i + 1),
            b'}' => return (skip_space(data, i + 1) == data.len()).then_some(found),
            _ => return None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_members_and_elements() {
        let data = br#" {"name": "a\"b", "nodes": [ {"id": [1, "]"]}, 2 ,"x" ], "n": null } "#;
        let found = members(data, &[b"nodes"]).unwrap();
        let text = |(a, b): (usize, usize)| std::str::from_utf8(&data[a..b]).unwrap().to_string();
        assert_eq!(found.len(), 3);
        assert_eq!((text(found[0].key), text(found[0].value)), ("\"name\"".into(), "\"a\\\"b\"".into()));
        let nodes: Vec<String> = found[1].elements.clone().unwrap().into_iter().map(text).collect();
        assert_eq!(nodes, vec![r#"{"id": [1, "]"]}"#, "2", "\"x\""]);
        assert_eq!((text(found[2].value), found[2].elements.is_none()), ("null".into(), true));
        assert_eq!(members(b"{}", &[]), Some(vec![]));
        assert_eq!(members(br#"{"nodes": []}"#, &[b"nodes"]).unwrap()[0].elements, Some(vec![]));
    }

    #[test]
    fn refuses_broken_structure() {
        for broken in [
            &br#"[]"#[..],
            br#"{"a" 1}"#,
            br#"{"a": 1,}"#,
            br#"{"a": 1} x"#,
            br#"{"nodes": [1 2]}"#,
            br#"{"nodes": [1,]}"#,
            br#"{"nodes": [,1]}"#,
            br#"{"nodes": [1"#,
            br#"{"a": "x}"#,
            br#"{"a": }"#,
            br#"{a: 1}"#,
        ] {
            assert_eq!(members(broken, &[b"nodes"]), None, "{}", String::from_utf8_lossy(broken));
        }
    }
}
