//! What the operator holds every submission and decision to, whatever the client asks: the
//! approval floor recorded in the run's options (`crate::approval::floor`), a published agent's
//! model chosen only among the operator's, and separation of duties (nobody decides calls of
//! runs it submitted, when the operator says so).
//!
//! Deliberately not here: the floor's rules (the approval module evaluates them, the same for
//! every front-end) and roles (`principals`).

use axum::http::StatusCode;

use super::error::ApiError;
use super::principals::Principal;
use super::state::AppState;
use crate::goal::Goal;
use crate::runs::RunOptions;

impl AppState {
    /// Puts the operator's floor for this submission in `opts` (the published agent's, with its
    /// goal's policy, when `agent` names one), and refuses a model the operator does not list
    /// for the agent (403 `server.agent_model`).
    pub(super) fn hold_to_floor(
        &self,
        opts: &mut RunOptions,
        agent: Option<&str>,
        goal: &Goal,
    ) -> Result<(), ApiError> {
        if let (Some(name), Some(asked)) = (agent, opts.model.as_deref()) {
            self.check_agent_model(name, asked, goal.model.as_deref())?;
        }
        opts.agent = agent.map(str::to_string);
        opts.floor = self
            .floor
            .for_run(agent.map(|name| (name, goal.approval.as_ref())));
        Ok(())
    }

    /// A client may run the published agent `name` on its goal's model (`own`) or one the
    /// operator lists for it; any other is 403 `server.agent_model`.
    pub(super) fn check_agent_model(
        &self,
        name: &str,
        asked: &str,
        own: Option<&str>,
    ) -> Result<(), ApiError> {
        let listed = self.agent_models.get(name);
        if own == Some(asked) || listed.is_some_and(|m| m.iter().any(|l| l == asked)) {
            return Ok(());
        }
        let choices: Vec<&str> = own
            .into_iter()
            .chain(listed.into_iter().flatten().map(String::as_str))
            .collect();
        Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "server.agent_model",
            format!(
                "agent `{name}` runs only on the models its operator lists{}",
                if choices.is_empty() {
                    " (leave `model` out)".to_string()
                } else {
                    format!(": {}", choices.join(", "))
                }
            ),
        ))
    }

    /// Separation of duties: with the operator's `separate_duties`, the principal that submitted
    /// run `id` may not decide or approve ahead its calls (403 `approval.own_run`).
    pub(super) async fn check_duties(&self, who: &Principal, id: &str) -> Result<(), ApiError> {
        if !self.separate_duties {
            return Ok(());
        }
        if self.submitter(id).await?.as_deref() == Some(who.name.as_str()) {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "approval.own_run",
                format!(
                    "`{}` submitted run {id}: another reviewer decides its calls (the operator separates duties)",
                    who.name
                ),
            ));
        }
        Ok(())
    }
}
