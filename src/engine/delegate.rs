//! Delegates (protocol chapters 014–015): a call to a tool with `_delegate` runs a nested agent
//! whose context is only what the call's `_scopes` allow.
//!
//! `_delegate` is a goal file path (relative to the parent goal's folder) or `"anonymous"`: a
//! goal made from the tool itself (its `description` is the goal, its `_output` the output
//! schema). The nested run gets the call's params as its input, the scoped parent data as
//! context messages, the parent's activities and approver, and the delegate goal's own model
//! (or the parent's when it names none). Nesting stops at depth 4.

use std::path::PathBuf;
use std::sync::Arc;

use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;

use super::builder::{AgentBuilder, str_field};
use crate::approval::Approver;
use crate::goal::Goal;
use crate::llm::Model;
use crate::protocol::{Call, Message, Tool};
use crate::tools::{ActivityError, ActivityFuture, ActivityOutput, DelegateRunner, Registry};

const MAX_DEPTH: u32 = 4;

pub(super) struct Delegates {
    pub base_dir: PathBuf,
    pub registry: Registry,
    pub model: Arc<dyn Model>,
    pub approver: Arc<dyn Approver>,
    pub cancel: CancellationToken,
    pub depth: u32,
}

fn config(tool: &Tool, reason: impl Into<String>) -> ActivityError {
    ActivityError::Config {
        tool: tool.name.clone(),
        reason: reason.into(),
    }
}

impl Delegates {
    fn goal_for(&self, tool: &Tool) -> Result<(Goal, bool), ActivityError> {
        let target = str_field(&tool.schema, "_delegate").ok_or_else(|| {
            config(
                tool,
                "`_delegate` must be a goal file path or \"anonymous\"",
            )
        })?;
        if target == "anonymous" {
            let description = str_field(&tool.schema, "description").unwrap_or(&tool.name);
            let goal = json!({
                "goal": description,
                "output_schema": tool.output.clone().unwrap_or_else(|| json!({})),
            });
            let goal =
                Goal::from_json(&goal.to_string(), tool.name.as_ref(), self.base_dir.clone())
                    .map_err(|e| config(tool, e.to_string()))?;
            return Ok((goal, false));
        }
        let path = self.base_dir.join(target);
        let goal = Goal::load(&path).map_err(|e| config(tool, e.to_string()))?;
        let own_model = goal.model.is_some();
        Ok((goal, own_model))
    }
}

impl DelegateRunner for Delegates {
    fn run_delegate(&self, tool: &Tool, call: Call, scoped: Map<String, Value>) -> ActivityFuture {
        if self.depth >= MAX_DEPTH {
            let e = config(
                tool,
                format!("delegates nest deeper than {MAX_DEPTH} levels"),
            );
            return Box::pin(async move { Err(e) });
        }
        let prepared = self.goal_for(tool);
        let registry = self.registry.clone();
        let model = self.model.clone();
        let approver = self.approver.clone();
        let cancel = self.cancel.child_token();
        let depth = self.depth + 1;
        let tool_name = tool.name.clone();
        Box::pin(async move {
            let (mut goal, own_model) = prepared?;
            let input: Map<String, Value> = call
                .params
                .into_iter()
                .filter(|(k, _)| !k.starts_with('_'))
                .collect();
            goal.input = Some(Value::Object(input));
            goal.input_schema = None;
            for (kind, data) in scoped {
                goal.context.push(Message::Data {
                    kind,
                    data,
                    schema: None,
                    instance: None,
                    extra: Map::new(),
                });
            }
            let mut b = AgentBuilder::new(goal)
                .registry(registry)
                .approver(approver)
                .cancel_token(cancel)
                .depth(depth);
            if !own_model {
                b = b.model(model);
            }
            let agent = b.build().map_err(|e| ActivityError::Failed {
                message: format!("delegate `{tool_name}` could not start: {e}"),
                details: json!({"code": e.code()}),
            })?;
            let result = agent.run().await;
            if result.succeeded() {
                Ok(ActivityOutput::from(result.output))
            } else {
                Err(ActivityError::Failed {
                    message: format!(
                        "delegate `{tool_name}` ended with status {}",
                        result.status.as_str()
                    ),
                    details: result.error.unwrap_or(Value::Null),
                })
            }
        })
    }
}
