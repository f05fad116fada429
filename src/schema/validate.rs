//! Compiled validators for final outputs and call params.

use std::collections::BTreeMap;
use std::sync::{Arc, LazyLock, Mutex};

use serde_json::{Map, Value};

use super::compose::last_definitions;
use super::{SchemaError, Subject, Violation, cap_message, is_meta_key};
use crate::protocol::{Params, Tool};

/// Compiles `schema` offline (no `$ref` is fetched) with `format` checks on.
///
/// The draft is the one the schema names in `$schema`, 2020-12 otherwise. Compiled validators
/// are shared process-wide by the schema's JSON text: every run of a goal composes and checks
/// the same schemas, and compiling them was most of the cost of starting a run (about 5 million
/// instructions of the research example's ~6 million, under callgrind). A schema that does not
/// compile is not cached, so its error is always reported against the subject asking.
pub(crate) fn compile(
    schema: &Value,
    subject: &Subject,
) -> Result<Arc<jsonschema::Validator>, SchemaError> {
    let key = schema.to_string();
    if let Some(v) = cache().get(&key) {
        return Ok(v.clone());
    }
    let compiled = jsonschema::options()
        .offline()
        .should_validate_formats(true)
        .build(schema)
        .map_err(|e| SchemaError::InvalidSchema {
            subject: subject.clone(),
            pointer: e.instance_path().as_str().to_string(),
            message: cap_message(describe(&e)),
        })?;
    let compiled = Arc::new(compiled);
    let mut c = cache();
    if c.len() >= CACHE_ENTRIES {
        // Whole-cache reset: simple, bounded, and a process that sees this many distinct
        // schemas (a server with many goals) only recompiles what it uses next.
        c.clear();
    }
    c.insert(key, compiled.clone());
    Ok(compiled)
}

/// How many compiled schemas the process keeps.
const CACHE_ENTRIES: usize = 512;

type Compiled = std::collections::HashMap<String, Arc<jsonschema::Validator>>;

fn cache() -> std::sync::MutexGuard<'static, Compiled> {
    static CACHE: LazyLock<Mutex<Compiled>> = LazyLock::new(Mutex::default);
    match CACHE.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

/// Every violation of `instance` against `validator`, sorted and without duplicates.
pub(crate) fn violations(validator: &jsonschema::Validator, instance: &Value) -> Vec<Violation> {
    // Most instances are valid: the yes/no check is much cheaper than collecting errors.
    if validator.is_valid(instance) {
        return Vec::new();
    }
    let mut out: Vec<Violation> = validator
        .iter_errors(instance)
        .map(|e| Violation {
            pointer: e.instance_path().as_str().to_string(),
            schema_pointer: e.schema_path().as_str().to_string(),
            keyword: e.kind().keyword().to_string(),
            message: cap_message(describe(&e)),
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

/// The error's message; for `anyOf` / `oneOf` failures, followed by why each option failed
/// (its first error), since "not valid under any of the schemas" alone does not help to fix it.
fn describe(e: &jsonschema::ValidationError<'_>) -> String {
    use jsonschema::error::ValidationErrorKind as K;
    let base = e.to_string();
    let context = match e.kind() {
        K::AnyOf { context } | K::OneOfNotValid { context } => context,
        _ => return base,
    };
    let parent = e.instance_path().as_str();
    let options: Vec<String> = context
        .iter()
        .enumerate()
        .filter_map(|(i, errors)| {
            let first = errors.first()?;
            let at = first.instance_path().as_str();
            Some(match at == parent {
                true => format!("option {}: {first}", i + 1),
                false => format!("option {}: at {at}: {first}", i + 1),
            })
        })
        .collect();
    if options.is_empty() {
        return base;
    }
    format!("{base} ({})", options.join("; "))
}

/// The user's output schema, compiled once; checks final outputs (rule 15).
#[derive(Debug)]
pub struct OutputValidator {
    schema: Value,
    validator: Arc<jsonschema::Validator>,
}

impl OutputValidator {
    /// Compiles the user's output schema.
    pub fn new(schema: &Value) -> Result<OutputValidator, SchemaError> {
        Self::with_subject(schema, Subject::OutputSchema)
    }

    /// Compiles `schema`, naming it `subject` in errors.
    pub(crate) fn with_subject(
        schema: &Value,
        subject: Subject,
    ) -> Result<OutputValidator, SchemaError> {
        Ok(OutputValidator {
            validator: compile(schema, &subject)?,
            schema: schema.clone(),
        })
    }

    /// Every way `output` breaks the schema; empty when it is valid.
    pub fn validate(&self, output: &Value) -> Vec<Violation> {
        violations(&self.validator, output)
    }

    /// True when `output` is valid (faster than [`OutputValidator::validate`]).
    pub fn is_valid(&self, output: &Value) -> bool {
        self.validator.is_valid(output)
    }

    /// The schema as given.
    pub fn schema(&self) -> &Value {
        &self.schema
    }
}

/// The params schema of one tool, compiled once.
///
/// The params schema is the tool schema without its meta keys (any key starting with `_`), and
/// without `_`-prefixed entries in `properties` and `required`: meta fields of a call are not
/// params and are never checked here.
#[derive(Debug)]
pub struct ParamsValidator {
    tool: String,
    /// The params schema, kept to check params as written ([`ParamsValidator::validate_written`]).
    schema: Map<String, Value>,
    validator: Arc<jsonschema::Validator>,
}

impl ParamsValidator {
    /// Compiles the params schema of `tool`.
    pub fn new(tool: &Tool) -> Result<ParamsValidator, SchemaError> {
        let schema = params_schema(&tool.schema);
        let validator = compile(
            &Value::Object(schema.clone()),
            &Subject::ToolParams(tool.name.clone()),
        )?;
        Ok(ParamsValidator {
            tool: tool.name.clone(),
            schema,
            validator,
        })
    }

    /// The tool's name.
    pub fn tool(&self) -> &str {
        &self.tool
    }

    /// Every way `params` (already resolved: no references left) breaks the tool's schema.
    /// Keys starting with `_` are ignored: params without any (the usual case: [`Call::parse`]
    /// refuses unknown meta keys) are checked in place, with no copy; others through a copy
    /// without them.
    ///
    /// [`Call::parse`]: crate::protocol::Call::parse
    pub fn validate(&self, params: &Params) -> Vec<Violation> {
        self.validate_value(params.as_value())
    }

    /// Every way `params` as written, references and all, breaks the tool's schema: a param
    /// that holds a reference anywhere in its value is left out and not required yet (it is
    /// checked once resolved, like any call); the others are checked as they are. The one check
    /// of params that may still hold references: `validate`'s plan check, the machine's check
    /// of a reviewer's edit or replacement, and the terminal reviewer's.
    pub fn validate_written(&self, params: &Params) -> Result<Vec<Violation>, SchemaError> {
        let deferred: Vec<&str> = params
            .iter()
            .filter(|(k, v)| !is_meta_key(k) && holds_reference(v))
            .map(|(k, _)| k.as_str())
            .collect();
        if deferred.is_empty() {
            return Ok(self.validate(params));
        }
        let mut schema = self.schema.clone();
        if let Some(Value::Array(required)) = schema.get_mut("required") {
            required.retain(|n| n.as_str().is_none_or(|n| !deferred.contains(&n)));
        }
        let literal: Map<String, Value> = params
            .iter()
            .filter(|(k, _)| !is_meta_key(k) && !deferred.contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let validator = compile(
            &Value::Object(schema),
            &Subject::ToolParams(self.tool.clone()),
        )?;
        Ok(violations(&validator, &Value::Object(literal)))
    }

    /// [`ParamsValidator::validate`] of a params object as it stands: checked in place, with no
    /// copy, unless it holds meta keys (then they are left out of a copy). Anything but an
    /// object is checked as it is (and fails an object schema).
    pub fn validate_value(&self, params: &Value) -> Vec<Violation> {
        match params {
            Value::Object(m) if m.keys().any(|k| is_meta_key(k)) => violations(
                &self.validator,
                &Value::Object(crate::protocol::without_meta(m)),
            ),
            _ => violations(&self.validator, params),
        }
    }
}

/// Whether a reference (`†...`) is anywhere in `v`.
fn holds_reference(v: &Value) -> bool {
    match v {
        Value::String(s) => crate::protocol::looks_like_reference(s),
        Value::Array(a) => a.iter().any(holds_reference),
        Value::Object(o) => o.values().any(holds_reference),
        _ => false,
    }
}

/// The params schema checked by [`ParamsValidator`]: meta keys and meta properties removed.
pub(crate) fn params_schema(schema: &Map<String, Value>) -> Map<String, Value> {
    let mut out = Map::new();
    for (k, v) in schema {
        if is_meta_key(k) {
            continue;
        }
        let v = match (k.as_str(), v) {
            ("properties", Value::Object(props)) => Value::Object(
                props
                    .iter()
                    .filter(|(p, _)| !is_meta_key(p))
                    .map(|(p, s)| (p.clone(), s.clone()))
                    .collect(),
            ),
            ("required", Value::Array(names)) => Value::Array(
                names
                    .iter()
                    .filter(|n| n.as_str().is_none_or(|n| !is_meta_key(n)))
                    .cloned()
                    .collect(),
            ),
            _ => v.clone(),
        };
        out.insert(k.clone(), v);
    }
    out
}

/// Checks `params` (after reference resolution) against `tool`, compiling its schema first.
///
/// Prefer [`ToolValidators`] when the same tools are checked many times.
pub fn validate_params(tool: &Tool, params: &Params) -> Result<Vec<Violation>, SchemaError> {
    Ok(ParamsValidator::new(tool)?.validate(params))
}

/// One compiled [`ParamsValidator`] per tool name; the last definition of a name wins.
#[derive(Debug, Default)]
pub struct ToolValidators {
    by_name: BTreeMap<String, ParamsValidator>,
}

impl ToolValidators {
    /// Compiles the params schema of the last definition of every tool name. Fails on the first
    /// invalid one.
    pub fn new(tools: &[Tool]) -> Result<ToolValidators, SchemaError> {
        let mut by_name = BTreeMap::new();
        for tool in last_definitions(tools) {
            by_name.insert(tool.name.clone(), ParamsValidator::new(tool)?);
        }
        Ok(ToolValidators { by_name })
    }

    /// Adds or replaces the validator of one tool.
    pub fn insert(&mut self, tool: &Tool) -> Result<(), SchemaError> {
        self.by_name
            .insert(tool.name.clone(), ParamsValidator::new(tool)?);
        Ok(())
    }

    /// The validator of `tool`, if known.
    pub fn get(&self, tool: &str) -> Option<&ParamsValidator> {
        self.by_name.get(tool)
    }

    /// The validator of `tool`, or `schema.tool_not_found`.
    fn known(&self, tool: &str) -> Result<&ParamsValidator, SchemaError> {
        self.get(tool).ok_or_else(|| SchemaError::ToolNotFound {
            tool: tool.to_string(),
        })
    }

    /// Checks `params` against the tool called `tool`.
    pub fn validate(&self, tool: &str, params: &Params) -> Result<Vec<Violation>, SchemaError> {
        Ok(self.known(tool)?.validate(params))
    }

    /// Checks `params` as written (references allowed) against the tool called `tool`
    /// ([`ParamsValidator::validate_written`]).
    pub fn validate_written(
        &self,
        tool: &str,
        params: &Params,
    ) -> Result<Vec<Violation>, SchemaError> {
        self.known(tool)?.validate_written(params)
    }

    /// Checks a params object against the tool called `tool`, in place when it holds no meta
    /// keys ([`ParamsValidator::validate_value`]).
    pub fn validate_value(
        &self,
        tool: &str,
        params: &Value,
    ) -> Result<Vec<Violation>, SchemaError> {
        Ok(self.known(tool)?.validate_value(params))
    }

    /// Names of the known tools, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.by_name.keys().map(String::as_str)
    }
}
