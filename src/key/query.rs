//! [`ValuePath`]: a JSONPath queried on a parsed document (a batch's items, an item's fields,
//! a fingerprint's fields, a key path the scanner does not read).
//!
//! Paths in the scanner's subset (members, indexes, wildcards) are walked here; the other
//! RFC 9535 forms (filters, descendants, slices, unions, functions) are `serde_json_path`'s,
//! behind the `jsonpath` feature. Without it such a path is refused when the extractor is
//! built, with an error that names the feature.

use serde_json::Value;

use super::PathError;
use super::scan::SimplePath;

/// A JSONPath, ready to query parsed JSON.
#[derive(Clone, Debug)]
pub(crate) enum ValuePath {
    /// In the scanner's subset.
    Simple(SimplePath),
    /// Any other RFC 9535 path.
    #[cfg(feature = "jsonpath")]
    Full(serde_json_path::JsonPath),
}

impl ValuePath {
    /// `path`, parsed: an error when it is not a JSONPath, or needs the `jsonpath` feature
    /// that is off.
    pub(crate) fn parse(path: &str) -> Result<Self, PathError> {
        if let Some(simple) = SimplePath::parse(path) {
            return Ok(ValuePath::Simple(simple));
        }
        #[cfg(feature = "jsonpath")]
        {
            serde_json_path::JsonPath::parse(path)
                .map(ValuePath::Full)
                .map_err(|err| PathError::new(path, err))
        }
        #[cfg(not(feature = "jsonpath"))]
        Err(PathError::new(
            path,
            "malformed, or not a path of members (`.a`, `['a']`), indexes (`[0]`, `[-1]`) and \
             wildcards (`[*]`, `.*`): filters, descendants, slices and the other RFC 9535 forms \
             need the crate feature `jsonpath`",
        ))
    }

    /// The values the path selects in `root`, in the order of the parsed document (members of
    /// an object in serde_json's order: by name, unless its `preserve_order` feature is on).
    pub(crate) fn select<'v>(&self, root: &'v Value) -> Vec<&'v Value> {
        match self {
            ValuePath::Simple(simple) => simple.select(root),
            #[cfg(feature = "jsonpath")]
            ValuePath::Full(full) => full.query(root).all(),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn select(path: &str, root: &Value) -> Vec<Value> {
        let path = ValuePath::parse(path).unwrap();
        path.select(root).into_iter().cloned().collect()
    }

    #[test]
    fn members_indexes_and_wildcards() {
        let doc = json!({"a": {"b": [1, 2, {"c": "x"}]}, "d": {"e": 3, "f": 4}});
        assert_eq!(select("$.a.b[0]", &doc), [json!(1)]);
        assert_eq!(select("$.a.b[-1].c", &doc), [json!("x")]);
        assert_eq!(select("$.a.b[-4]", &doc), Vec::<Value>::new());
        assert_eq!(select("$.a.b[7]", &doc), Vec::<Value>::new());
        assert_eq!(select("$['d'].*", &doc), [json!(3), json!(4)]);
        assert_eq!(select("$.a.b[*]", &doc).len(), 3);
        assert_eq!(select("$.missing.b", &doc), Vec::<Value>::new());
        assert_eq!(select("$", &doc), std::slice::from_ref(&doc));
    }

    /// Where both read a path, the walk and `serde_json_path` select the same values in the
    /// same order.
    #[cfg(feature = "jsonpath")]
    #[test]
    fn the_walk_selects_what_serde_json_path_selects() {
        let doc = json!({
            "entry": [
                {"changes": [{"value": {"messages": [{"id": "A"}, {"id": "B"}]}}]},
                {"changes": [{"value": {"messages": [{"id": "C"}], "statuses": [{"id": 7}]}}]}
            ],
            "o": {"z": 1, "a": 2, "m": [3, 4]},
            "n": null
        });
        for path in [
            "$.entry[*].changes[*].value.messages[*].id",
            "$.entry[-1].changes[0].value.statuses[0].id",
            "$.entry[1].changes[*].value.*",
            "$.o.*",
            "$['o']['m'][-2]",
            "$.n.x",
            "$.entry[5]",
            "$.*",
        ] {
            let ValuePath::Simple(walked) = ValuePath::parse(path).unwrap() else {
                panic!("{path} is in the subset");
            };
            let full = serde_json_path::JsonPath::parse(path).unwrap();
            assert_eq!(walked.select(&doc), full.query(&doc).all(), "{path}");
        }
    }

    #[test]
    fn other_forms_need_the_feature_or_are_full_paths() {
        let filter = ValuePath::parse("$.items[?@.kind == 'a'].id");
        #[cfg(feature = "jsonpath")]
        assert!(matches!(filter, Ok(ValuePath::Full(_))));
        #[cfg(not(feature = "jsonpath"))]
        assert!(filter.unwrap_err().to_string().contains("`jsonpath`"));
        assert!(ValuePath::parse("$.entry[").is_err());
        assert!(ValuePath::parse("entry").is_err());
    }
}
