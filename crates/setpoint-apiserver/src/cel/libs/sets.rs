//! The sets library (cel-go's `ext.Sets`, which Kubernetes includes): `sets.contains`,
//! `sets.equivalent` and `sets.intersects` over lists, with CEL equality.

use cel::common::types::{CelBool, LIST_TYPE};
use cel::common::value::{CowVal, Val};
use cel::{DeclarationError, Env, ExecutionError};

use super::{args, elements};

pub(super) fn register(env: &mut Env) -> Result<(), DeclarationError> {
    env.add_overload(
        "sets.contains",
        "list_sets_contains_list",
        vec![LIST_TYPE, LIST_TYPE],
        contains,
    )?;
    env.add_overload(
        "sets.equivalent",
        "list_sets_equivalent_list",
        vec![LIST_TYPE, LIST_TYPE],
        equivalent,
    )?;
    env.add_overload(
        "sets.intersects",
        "list_sets_intersects_list",
        vec![LIST_TYPE, LIST_TYPE],
        intersects,
    )?;
    Ok(())
}

/// Whether every element of `sub` is in `set`.
fn includes(set: &[&dyn Val], sub: &[&dyn Val]) -> bool {
    sub.iter().all(|x| set.iter().any(|y| y.equals(*x)))
}

fn pair<'b, 'v, R>(
    call: Vec<CowVal<'b, 'v>>,
    f: impl Fn(&[&dyn Val], &[&dyn Val]) -> R,
) -> Result<R, ExecutionError> {
    let [a, b] = args::<2>(&call)?;
    let a = elements(a.as_ref())?;
    let b = elements(b.as_ref())?;
    Ok(f(&a, &b))
}

fn contains<'b, 'v>(call: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let r = pair(call, includes)?;
    Ok(CowVal::owned(CelBool::from(r)))
}

fn equivalent<'b, 'v>(call: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let r = pair(call, |a, b| includes(a, b) && includes(b, a))?;
    Ok(CowVal::owned(CelBool::from(r)))
}

fn intersects<'b, 'v>(call: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let r = pair(call, |a, b| {
        a.iter().any(|x| b.iter().any(|y| y.equals(*x)))
    })?;
    Ok(CowVal::owned(CelBool::from(r)))
}

#[cfg(test)]
mod tests {
    use super::super::testing::assert_true;

    /// cel-go's documented examples for `ext.Sets`.
    #[test]
    fn documented_examples() {
        assert_true(&[
            "sets.contains([], [])",
            "sets.contains([1, 2, 3, 4], [2, 3])",
            "!sets.contains([1, 2, 3], [4])",
            "sets.contains([[1], [2, 3]], [[2, 3]])",
            "sets.equivalent([], [])",
            "sets.equivalent([1], [1, 1])",
            "sets.equivalent([1, 2, 3], [3, 2, 1])",
            "!sets.equivalent([2, 1], [2, 3])",
            "sets.intersects([1], [1, 2])",
            "!sets.intersects([], [1])",
            "sets.intersects([[1], [2, 3]], [[1, 2], [2, 3]])",
        ]);
    }
}
