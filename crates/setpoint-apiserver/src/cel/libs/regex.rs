//! Kubernetes' regex library: `find` and `findAll` on strings
//! (`k8s.io/apiserver/pkg/cel/library/regex.go`). Patterns are the `regex` crate's, which
//! follows RE2's syntax, the one upstream uses.

use std::sync::{Arc, LazyLock, Mutex};

use cel::common::types::{CelInt, CelList, CelString};
use cel::common::value::Val;
use cel::{DeclarationError, Env, ExecutionError};

pub(super) fn register(env: &mut Env) -> Result<(), DeclarationError> {
    cel::add_member_overload!(env, fn find: (CelString, CelString) -> Result<CelString>,
        id = "string_find_string")?;
    cel::add_member_overload!(env, fn find_all: (CelString, CelString) -> Result<CelList>,
        id = "string_find_all_string")?;
    cel::add_member_overload!(env, fn find_all_n: (CelString, CelString, CelInt) -> Result<CelList>,
        name = "findAll", id = "string_find_all_string_int")?;
    Ok(())
}

/// Compiled patterns: rules name a handful of them, evaluated for every object.
static PATTERNS: LazyLock<Mutex<std::collections::HashMap<String, Arc<regex::Regex>>>> =
    LazyLock::new(Default::default);

fn pattern(function: &str, re: &str) -> Result<Arc<regex::Regex>, ExecutionError> {
    let mut cache = PATTERNS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(r) = cache.get(re) {
        return Ok(r.clone());
    }
    let compiled = Arc::new(regex::Regex::new(re).map_err(|e| {
        ExecutionError::function_error(function, format!("error parsing regexp: {e}"))
    })?);
    if cache.len() >= 1024 {
        cache.clear();
    }
    cache.insert(re.to_string(), compiled.clone());
    Ok(compiled)
}

fn find(this: &CelString<'_>, re: &CelString<'_>) -> Result<CelString<'static>, ExecutionError> {
    let r = pattern("find", re.inner())?;
    Ok(r.find(this.inner())
        .map(|m| m.as_str().to_string())
        .unwrap_or_default()
        .into())
}

fn matches_up_to(this: &str, r: &regex::Regex, limit: Option<usize>) -> CelList<'static> {
    let found: Vec<Box<dyn Val>> = r
        .find_iter(this)
        .take(limit.unwrap_or(usize::MAX))
        .map(|m| Box::new(CelString::from(m.as_str().to_string())) as Box<dyn Val>)
        .collect();
    CelList::from(found)
}

fn find_all(this: &CelString<'_>, re: &CelString<'_>) -> Result<CelList<'static>, ExecutionError> {
    let r = pattern("findAll", re.inner())?;
    Ok(matches_up_to(this.inner(), &r, None))
}

fn find_all_n(
    this: &CelString<'_>,
    re: &CelString<'_>,
    n: &CelInt,
) -> Result<CelList<'static>, ExecutionError> {
    let r = pattern("findAll", re.inner())?;
    // As Go's `FindAllString`: a negative limit means all of them.
    let limit = usize::try_from(*n.inner()).ok();
    Ok(matches_up_to(this.inner(), &r, limit))
}

#[cfg(test)]
mod tests {
    use super::super::testing::{assert_error, assert_true};

    /// Upstream's documented examples.
    #[test]
    fn documented_examples() {
        assert_true(&[
            "'abc 123'.find('[0-9]+') == '123'",
            "'abc'.find('[0-9]+') == ''",
            "'123 abc 456'.findAll('[0-9]+') == ['123', '456']",
            "'123 abc 456'.findAll('[0-9]+', 1) == ['123']",
            "'123 abc 456'.findAll('[0-9]+', -1) == ['123', '456']",
            "'123 abc 456'.findAll('[0-9]+', 0) == []",
            "'abc'.findAll('xyz') == []",
        ]);
        assert_error("'abc'.find('[')", "error parsing regexp");
    }
}
