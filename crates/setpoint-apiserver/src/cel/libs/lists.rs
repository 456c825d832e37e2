//! Kubernetes' lists library: `isSorted`, `sum`, `min`, `max`, `indexOf` and `lastIndexOf`
//! on any list (`k8s.io/apiserver/pkg/cel/library/lists.go`).

use std::cmp::Ordering;

use cel::common::types::{CelBool, CelInt, DYN_TYPE, LIST_TYPE};
use cel::common::value::{CowVal, Val};
use cel::{DeclarationError, Env, ExecutionError};

use super::{args, elements};

pub(super) fn register(env: &mut Env) -> Result<(), DeclarationError> {
    env.add_member_overload("isSorted", "list_is_sorted", LIST_TYPE, vec![], is_sorted)?;
    env.add_member_overload("sum", "list_sum", LIST_TYPE, vec![], sum)?;
    env.add_member_overload("min", "list_min", LIST_TYPE, vec![], min)?;
    env.add_member_overload("max", "list_max", LIST_TYPE, vec![], max)?;
    env.add_member_overload(
        "indexOf",
        "list_index_of",
        LIST_TYPE,
        vec![DYN_TYPE],
        index_of,
    )?;
    env.add_member_overload(
        "lastIndexOf",
        "list_last_index_of",
        LIST_TYPE,
        vec![DYN_TYPE],
        last_index_of,
    )?;
    Ok(())
}

fn compare(a: &dyn Val, b: &dyn Val) -> Result<Ordering, ExecutionError> {
    let comparer = a.as_comparer().ok_or_else(|| {
        ExecutionError::no_such_overload(
            "_<_",
            vec![a.get_type().name().into(), b.get_type().name().into()],
        )
    })?;
    comparer.compare(b)
}

fn is_sorted<'b, 'v>(call: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let [list] = args::<1>(&call)?;
    let items = elements(list.as_ref())?;
    for pair in items.windows(2) {
        if compare(pair[0], pair[1])? == Ordering::Greater {
            return Ok(CowVal::owned(CelBool::from(false)));
        }
    }
    Ok(CowVal::owned(CelBool::from(true)))
}

fn sum<'b, 'v>(call: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let [list] = args::<1>(&call)?;
    let items = elements(list.as_ref())?;
    let Some((first, rest)) = items.split_first() else {
        // Upstream's sum of an empty list is the zero of its element type; with no element
        // to tell the type, an int.
        return Ok(CowVal::owned(CelInt::from(0)));
    };
    let mut acc: Box<dyn Val + 'v> = first.clone_as_boxed();
    for item in rest {
        let adder = acc.as_adder().ok_or_else(|| {
            ExecutionError::function_error(
                "sum",
                format!("sum of a list of {} is not defined", acc.get_type().name()),
            )
        })?;
        let next = adder.add(*item)?.into_owned();
        acc = next;
    }
    Ok(CowVal::Owned(acc))
}

fn extreme<'b, 'v>(
    call: Vec<CowVal<'b, 'v>>,
    name: &str,
    keep: Ordering,
) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let [list] = args::<1>(&call)?;
    let items = elements(list.as_ref())?;
    let Some((first, rest)) = items.split_first() else {
        return Err(ExecutionError::function_error(
            name,
            format!("{name} called on empty list"),
        ));
    };
    let mut best = *first;
    for item in rest {
        if compare(*item, best)? == keep {
            best = *item;
        }
    }
    Ok(CowVal::Owned(best.clone_as_boxed()))
}

fn min<'b, 'v>(call: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    extreme(call, "min", Ordering::Less)
}

fn max<'b, 'v>(call: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    extreme(call, "max", Ordering::Greater)
}

fn position<'b, 'v>(
    call: Vec<CowVal<'b, 'v>>,
    last: bool,
) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let [list, needle] = args::<2>(&call)?;
    let items = elements(list.as_ref())?;
    let hit = |item: &&(dyn Val + '_)| item.equals(needle.as_ref());
    let found = if last {
        items.iter().rposition(hit)
    } else {
        items.iter().position(hit)
    };
    Ok(CowVal::owned(CelInt::from(found.map_or(-1, |i| i as i64))))
}

fn index_of<'b, 'v>(call: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    position(call, false)
}

fn last_index_of<'b, 'v>(call: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    position(call, true)
}

#[cfg(test)]
mod tests {
    use super::super::testing::{assert_error, assert_true};

    /// Upstream's documented examples (the "CEL in Kubernetes" lists library table).
    #[test]
    fn documented_examples() {
        assert_true(&[
            "[1, 2, 3].isSorted()",
            "!['c', 'b', 'a'].isSorted()",
            "[].isSorted()",
            "[1, 2, 3].sum() == 6",
            "[1.0, 2.5].sum() == 3.5",
            "[].sum() == 0",
            "[1, 2, 3].min() == 1",
            "['b', 'a', 'c'].max() == 'c'",
            "[1, 2, 3, 2].indexOf(2) == 1",
            "[1, 2, 3, 2].lastIndexOf(2) == 3",
            "[1, 2].indexOf(5) == -1",
            // The string overloads of the strings extension still apply to strings.
            "'abcb'.indexOf('b') == 1",
        ]);
        assert_error("[].min()", "min called on empty list");
        assert_error("[].max()", "max called on empty list");
    }
}
