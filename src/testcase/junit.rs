//! JUnit XML for `dagloop test --junit FILE`: one `<testsuite>` of `<testcase>`s, a failed
//! case with a `<failure>` holding every failure. Written by hand (a few elements), with text
//! and attributes escaped.

/// One case's outcome.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The case's name.
    pub name: String,
    /// Seconds it took.
    pub seconds: f64,
    /// What failed (empty: passed).
    pub failures: Vec<String>,
}

/// `s` with the five XML specials escaped, and characters XML 1.0 cannot hold (control
/// characters other than tab, newline and carriage return) replaced by `?`.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\t' | '\n' | '\r' => out.push(c),
            c if (c as u32) < 0x20 || c == '\u{fffe}' || c == '\u{ffff}' => out.push('?'),
            c => out.push(c),
        }
    }
    out
}

/// The report of `cases`, as a `dagloop` test suite.
pub fn report(cases: &[Outcome]) -> String {
    let failed = cases.iter().filter(|c| !c.failures.is_empty()).count();
    let total: f64 = cases.iter().map(|c| c.seconds).sum();
    let mut x = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    x.push_str(&format!(
        "<testsuites tests=\"{}\" failures=\"{failed}\" time=\"{total:.3}\">\n  <testsuite name=\"dagloop\" tests=\"{}\" failures=\"{failed}\" errors=\"0\" time=\"{total:.3}\">\n",
        cases.len(),
        cases.len()
    ));
    for c in cases {
        let name = escape(&c.name);
        if c.failures.is_empty() {
            x.push_str(&format!(
                "    <testcase name=\"{name}\" classname=\"dagloop\" time=\"{:.3}\"/>\n",
                c.seconds
            ));
        } else {
            let first = c.failures.first().map(String::as_str).unwrap_or_default();
            x.push_str(&format!(
                "    <testcase name=\"{name}\" classname=\"dagloop\" time=\"{:.3}\">\n      <failure message=\"{}\">{}</failure>\n    </testcase>\n",
                c.seconds,
                escape(first),
                escape(&c.failures.join("\n"))
            ));
        }
    }
    x.push_str("  </testsuite>\n</testsuites>\n");
    x
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_failures_are_escaped() {
        let x = report(&[
            Outcome {
                name: "a<b>&\"c'".into(),
                seconds: 0.5,
                failures: vec![],
            },
            Outcome {
                name: "x".into(),
                seconds: 1.0,
                failures: vec!["output: expected <1>, got \"2\" & \u{1}".into()],
            },
        ]);
        assert!(x.contains("name=\"a&lt;b&gt;&amp;&quot;c&apos;\""), "{x}");
        assert!(
            x.contains("expected &lt;1&gt;, got &quot;2&quot; &amp; ?"),
            "{x}"
        );
        assert!(x.contains("tests=\"2\" failures=\"1\""), "{x}");
        assert!(!x.contains('\u{1}'));
    }
}
