//! The meta keys dagloop defines (keys starting with `_`), listed once, and the check that
//! refuses any other: a typo such as `"_aproval"` fails closed, with the closest known key
//! suggested, instead of being kept as a param and ignored.
//!
//! The lists here are the only definition: the goal loader, the plan parser, `validate`, the
//! server and the published schemas (`schemas/*.schema.json`, checked by `tests/schema_files.rs`)
//! all refer to them. Deliberately not here: what a meta key means (each one's own module).

/// Meta keys a call may carry: `_tool` names the tool; `_outputPath` and `_outputMethod` say
/// where and how the result is written; `_instance` and `_scopes` are protocol chapters 013 and
/// 015; `_output` is the value of a latent call (the model fills it in).
pub const CALL_META_KEYS: &[&str] = &[
    "_tool",
    "_outputPath",
    "_outputMethod",
    "_instance",
    "_scopes",
    "_output",
];

/// Meta keys a tool definition may carry. Besides these, a tool whose `_activity` names a kind
/// may carry that kind's settings under `_` + the kind's name (`"_activity": "upper"` with
/// `"_upper": {...}`), the way `_http` and `_shell` are the built-in kinds' settings.
/// `_mcp` is set by dagloop on the tools of MCP servers.
pub const TOOL_META_KEYS: &[&str] = &[
    "_tool",
    "_output",
    "_activity",
    "_approval",
    "_outputPath",
    "_outputMethod",
    "_http",
    "_shell",
    "_delegate",
    "_mcp",
    "_idempotent",
    "_detached",
];

/// The activity kinds dagloop itself provides: their settings are listed in
/// [`TOOL_META_KEYS`] (`_http`, `_shell`, `_delegate`, `_mcp`; `rust` has none), so `_` + one
/// of them is not a kind's settings key beyond that list.
pub const BUILT_IN_KINDS: &[&str] = &["delegate", "http", "mcp", "rust", "shell"];

/// True for a key reserved for dagloop: anything starting with `_`.
pub fn is_meta_key(key: &str) -> bool {
    key.starts_with('_')
}

/// A meta key dagloop does not define, with the closest defined one when some is close enough.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownMetaKey {
    /// The key as written.
    pub key: String,
    /// The closest known key, when one is within a small edit distance.
    pub suggestion: Option<String>,
}

impl std::fmt::Display for UnknownMetaKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "unknown meta key `{}`", self.key)?;
        match &self.suggestion {
            Some(s) => write!(f, " (did you mean `{s}`?)"),
            None => Ok(()),
        }
    }
}

/// The first key of `keys` that is a meta key but neither in `known` nor one of `extra`
/// (e.g. a tool's own kind settings), in the keys' order.
pub fn first_unknown<'a>(
    keys: impl IntoIterator<Item = &'a str>,
    known: &[&str],
    extra: &[&str],
) -> Option<UnknownMetaKey> {
    let key = keys
        .into_iter()
        .find(|k| is_meta_key(k) && !known.contains(k) && !extra.contains(k))?;
    let candidates = known.iter().chain(extra).copied();
    Some(UnknownMetaKey {
        key: key.to_string(),
        suggestion: closest(key, candidates).map(str::to_string),
    })
}

/// The candidate closest to `word` by edit distance (ASCII case ignored), if it is close
/// enough to be a typo: at most a third of the word's length, and at most 3 edits.
pub fn closest<'a>(word: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let limit = (word.chars().count() / 3).clamp(1, 3);
    let lower = word.to_ascii_lowercase();
    candidates
        .into_iter()
        .map(|c| (distance(&lower, &c.to_ascii_lowercase()), c))
        .filter(|(d, _)| *d <= limit)
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

/// Levenshtein distance over chars, with adjacent transpositions counting one (`_apporval`).
fn distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    // Three rows: two back (for transpositions), one back, current.
    let mut prev2: Vec<usize> = vec![0; b.len() + 1];
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    let mut cur: Vec<usize> = vec![0; b.len() + 1];
    for i in 1..=a.len() {
        cur[0] = i;
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut d = (prev[j] + 1).min(cur[j - 1] + 1).min(prev[j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                d = d.min(prev2[j - 2] + 1);
            }
            cur[j] = d;
        }
        std::mem::swap(&mut prev2, &mut prev);
        std::mem::swap(&mut prev, &mut cur);
    }
    prev[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typos_get_the_closest_key() {
        let s = |k: &str| first_unknown([k], TOOL_META_KEYS, &[]).and_then(|u| u.suggestion);
        assert_eq!(s("_aproval").as_deref(), Some("_approval"));
        assert_eq!(s("_apporval").as_deref(), Some("_approval"));
        assert_eq!(s("_Activity").as_deref(), Some("_activity"));
        assert_eq!(s("_outputpath").as_deref(), Some("_outputPath"));
        assert_eq!(s("_zzzzzzzzzz"), None);
        assert_eq!(first_unknown(["_approval", "x"], TOOL_META_KEYS, &[]), None);
        assert_eq!(first_unknown(["_upper"], TOOL_META_KEYS, &["_upper"]), None);
        let u = first_unknown(["a", "_outptuPath"], CALL_META_KEYS, &[]).expect("unknown");
        assert_eq!(
            u.to_string(),
            "unknown meta key `_outptuPath` (did you mean `_outputPath`?)"
        );
    }

    #[test]
    fn distance_counts_edits() {
        assert_eq!(distance("", "abc"), 3);
        assert_eq!(distance("abc", "abc"), 0);
        assert_eq!(distance("abc", "acb"), 1);
        assert_eq!(distance("kitten", "sitting"), 3);
    }
}
