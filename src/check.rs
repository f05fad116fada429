//! Static checks of a plan (`dagloop validate`) and its dependency graph (`dagloop graph`).
//!
//! Pure: takes calls and tools, returns findings. Nothing runs.

use petgraph::algo::tarjan_scc;
use petgraph::graph::DiGraph;
use serde::Serialize;
use serde_json::{Map, Value};

use crate::protocol::{Call, Path, Tool};

/// One problem found in a plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    /// Stable code (`plan.unknown_tool`, `plan.invalid_params`, `plan.cycle`, `plan.dangling_reference`,
    /// `plan.bad_reference`).
    pub code: &'static str,
    /// Index of the call in the plan.
    pub call: usize,
    /// What is wrong.
    pub message: String,
}

/// A plan's dependency edges: `(writer index, reader index, path)`.
pub fn edges(calls: &[Call]) -> Vec<(usize, usize, String)> {
    let writes: Vec<Vec<Path>> = calls.iter().map(write_paths).collect();
    let reads: Vec<Vec<Path>> = calls.iter().map(read_paths).collect();
    let mut out = Vec::new();
    for (w, wp) in writes.iter().enumerate() {
        for (r, rp) in reads.iter().enumerate() {
            if w == r {
                continue;
            }
            if let Some(p) = rp.iter().find(|p| wp.iter().any(|q| q.overlaps(p))) {
                out.push((w, r, p.to_string()));
            }
        }
    }
    out
}

fn write_paths(c: &Call) -> Vec<Path> {
    match c.output_target() {
        Ok(Some(e)) => e.refs.into_iter().map(|r| r.path).collect(),
        _ => Vec::new(),
    }
}

fn read_paths(c: &Call) -> Vec<Path> {
    c.references()
        .map(|refs| {
            refs.into_iter()
                .flat_map(|(_, e)| e.refs.into_iter().map(|r| r.path))
                .collect()
        })
        .unwrap_or_default()
}

/// Checks a plan against tools and the data available before it runs (`initial`: kind → value).
pub fn check(calls: &[Call], tools: Option<&[Tool]>, initial: &Map<String, Value>) -> Vec<Finding> {
    let mut out = Vec::new();
    for (i, c) in calls.iter().enumerate() {
        if let Err(e) = c.references() {
            out.push(Finding {
                code: "plan.bad_reference",
                call: i,
                message: e.to_string(),
            });
        }
        if let Err(e) = c.output_target() {
            out.push(Finding {
                code: "plan.bad_reference",
                call: i,
                message: e.to_string(),
            });
        }
        if let Some(tools) = tools {
            match tools.iter().rev().find(|t| t.name == c.tool) {
                None => out.push(Finding {
                    code: "plan.unknown_tool",
                    call: i,
                    message: format!("no tool named `{}`", c.tool),
                }),
                Some(t) => {
                    let literal: Map<String, Value> = c
                        .params
                        .iter()
                        .filter(|(k, v)| {
                            !k.starts_with('_')
                                && !v
                                    .as_str()
                                    .is_some_and(crate::protocol::looks_like_reference)
                        })
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect();
                    let mut schema = t.schema.clone();
                    schema.retain(|k, _| !k.starts_with('_'));
                    // References are checked once resolved at run time: only literal params here.
                    schema.remove("required");
                    if let Ok(v) = jsonschema::validator_for(&Value::Object(schema)) {
                        for e in v.iter_errors(&Value::Object(literal)) {
                            out.push(Finding {
                                code: "plan.invalid_params",
                                call: i,
                                message: format!("{e} at `{}`", e.instance_path()),
                            });
                        }
                    }
                }
            }
        }
    }
    let writes: Vec<Vec<Path>> = calls.iter().map(write_paths).collect();
    for (i, c) in calls.iter().enumerate() {
        for p in read_paths(c) {
            let written = writes
                .iter()
                .enumerate()
                .any(|(j, w)| j != i && w.iter().any(|q| q.overlaps(&p)));
            let present = initial
                .get(p.kind())
                .is_some_and(|v| crate::state::apply::get(v, p.rest()).is_some());
            if !written && !present {
                out.push(Finding {
                    code: "plan.dangling_reference",
                    call: i,
                    message: format!("nothing writes `{p}` and it is not in the initial data"),
                });
            }
        }
    }
    let mut g = DiGraph::<usize, ()>::new();
    let nodes: Vec<_> = (0..calls.len()).map(|i| g.add_node(i)).collect();
    for (w, r, _) in edges(calls) {
        g.add_edge(nodes[w], nodes[r], ());
    }
    for scc in tarjan_scc(&g) {
        if scc.len() > 1 {
            let mut ids: Vec<usize> = scc.iter().map(|n| g[*n]).collect();
            ids.sort_unstable();
            out.push(Finding {
                code: "plan.cycle",
                call: ids[0],
                message: format!(
                    "calls {} depend on each other in a cycle",
                    ids.iter()
                        .map(|i| format!("#{i} ({})", calls[*i].tool))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            });
        }
    }
    out.sort_by(|a, b| (a.call, a.code).cmp(&(b.call, b.code)));
    out
}

/// The dependency graph as Mermaid.
pub fn mermaid(calls: &[Call]) -> String {
    let mut s = String::from("graph TD\n");
    for (i, c) in calls.iter().enumerate() {
        s.push_str(&format!("    c{i}[\"#{i} {}\"]\n", escape(&c.tool)));
    }
    for (w, r, p) in edges(calls) {
        s.push_str(&format!("    c{w} -- \"{}\" --> c{r}\n", escape(&p)));
    }
    s
}

/// The dependency graph as Graphviz dot.
pub fn dot(calls: &[Call]) -> String {
    let mut s = String::from("digraph plan {\n");
    for (i, c) in calls.iter().enumerate() {
        s.push_str(&format!("    c{i} [label=\"#{i} {}\"];\n", escape(&c.tool)));
    }
    for (w, r, p) in edges(calls) {
        s.push_str(&format!("    c{w} -> c{r} [label=\"{}\"];\n", escape(&p)));
    }
    s.push_str("}\n");
    s
}

fn escape(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "'")
}
