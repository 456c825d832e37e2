//! Kubernetes' quantity library (`k8s.io/apiserver/pkg/cel/library/quantity.go`): the
//! `kubernetes.Quantity` type, parsed and compared by `setpoint_api::quantity`, so `1`
//! equals `1000m` as upstream's `Equal` says.

use cel::common::types::{CelBool, CelDouble, CelInt, CelString};
use cel::{DeclarationError, Env, ExecutionError};
use setpoint_api::quantity::Quantity;

use super::opaque_val;

/// A CEL value of type `kubernetes.Quantity`.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct CelQuantity(Quantity);

opaque_val!(
    CelQuantity,
    cel::common::types::Type::new_unspecified_type("kubernetes.Quantity")
);

pub(super) fn register(env: &mut Env) -> Result<(), DeclarationError> {
    env.add_type(cel::common::types::Type::new_unspecified_type(
        "kubernetes.Quantity",
    ))?;
    cel::add_overload!(env, fn quantity: (CelString) -> Result<CelQuantity>,
        id = "string_to_quantity")?;
    cel::add_overload!(env, fn is_quantity: (CelString) -> CelBool,
        name = "isQuantity", id = "is_quantity_string")?;
    cel::add_member_overload!(env, fn sign: (CelQuantity) -> CelInt, id = "quantity_sign")?;
    cel::add_member_overload!(env, fn is_integer: (CelQuantity) -> CelBool,
        id = "quantity_is_integer")?;
    cel::add_member_overload!(env, fn as_integer: (CelQuantity) -> Result<CelInt>,
        id = "quantity_get_integer")?;
    cel::add_member_overload!(env, fn as_approximate_float: (CelQuantity) -> CelDouble,
        id = "quantity_get_float")?;
    cel::add_member_overload!(env, fn is_greater_than: (CelQuantity, CelQuantity) -> CelBool,
        id = "quantity_is_greater_than")?;
    cel::add_member_overload!(env, fn is_less_than: (CelQuantity, CelQuantity) -> CelBool,
        id = "quantity_is_less_than")?;
    cel::add_member_overload!(env, fn compare_to: (CelQuantity, CelQuantity) -> CelInt,
        id = "quantity_compare_to")?;
    cel::add_member_overload!(env, fn add: (CelQuantity, CelQuantity) -> Result<CelQuantity>,
        id = "quantity_add")?;
    cel::add_member_overload!(env, fn add_int: (CelQuantity, CelInt) -> Result<CelQuantity>,
        name = "add", id = "quantity_add_int")?;
    cel::add_member_overload!(env, fn sub: (CelQuantity, CelQuantity) -> Result<CelQuantity>,
        id = "quantity_sub")?;
    cel::add_member_overload!(env, fn sub_int: (CelQuantity, CelInt) -> Result<CelQuantity>,
        name = "sub", id = "quantity_sub_int")?;
    Ok(())
}

/// Upstream's `resource.ErrFormatWrong`, what a text that is not a quantity fails with.
const FORMAT_WRONG: &str =
    "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'";

fn quantity(s: &CelString<'_>) -> Result<CelQuantity, ExecutionError> {
    Quantity::parse(s.inner())
        .map(CelQuantity)
        .map_err(|_| ExecutionError::function_error("quantity", FORMAT_WRONG))
}

fn is_quantity(s: &CelString<'_>) -> CelBool {
    Quantity::parse(s.inner()).is_ok().into()
}

fn sign(q: &CelQuantity) -> CelInt {
    q.0.signum().into()
}

fn is_integer(q: &CelQuantity) -> CelBool {
    q.0.as_exact_integer().is_some().into()
}

fn as_integer(q: &CelQuantity) -> Result<CelInt, ExecutionError> {
    q.0.as_exact_integer().map(CelInt::from).ok_or_else(|| {
        ExecutionError::function_error("asInteger", "cannot convert value to integer")
    })
}

fn as_approximate_float(q: &CelQuantity) -> CelDouble {
    q.0.as_approximate_float().into()
}

fn is_greater_than(a: &CelQuantity, b: &CelQuantity) -> CelBool {
    (a.0 > b.0).into()
}

fn is_less_than(a: &CelQuantity, b: &CelQuantity) -> CelBool {
    (a.0 < b.0).into()
}

fn compare_to(a: &CelQuantity, b: &CelQuantity) -> CelInt {
    (a.0.cmp(&b.0) as i64).into()
}

fn sum(function: &str, a: Quantity, b: Quantity) -> Result<CelQuantity, ExecutionError> {
    (a + b)
        .map(CelQuantity)
        .ok_or_else(|| ExecutionError::function_error(function, "quantity overflow"))
}

fn add(a: &CelQuantity, b: &CelQuantity) -> Result<CelQuantity, ExecutionError> {
    sum("add", a.0, b.0)
}

fn add_int(a: &CelQuantity, b: &CelInt) -> Result<CelQuantity, ExecutionError> {
    sum("add", a.0, Quantity::from_integer(*b.inner()))
}

fn sub(a: &CelQuantity, b: &CelQuantity) -> Result<CelQuantity, ExecutionError> {
    sum("sub", a.0, b.0.negated())
}

fn sub_int(a: &CelQuantity, b: &CelInt) -> Result<CelQuantity, ExecutionError> {
    sum("sub", a.0, Quantity::from_integer(*b.inner()).negated())
}

#[cfg(test)]
mod tests {
    use super::super::testing::{assert_error, assert_true};

    /// Upstream's documented examples (the quantity library table of "CEL in Kubernetes").
    #[test]
    fn documented_examples() {
        assert_true(&[
            "quantity('1.5G').isGreaterThan(quantity('1G'))",
            "quantity('1.5G').isLessThan(quantity('2G'))",
            "quantity('1') == quantity('1000m')",
            "quantity('200M').compareTo(quantity('0.2G')) == 0",
            "quantity('50k').compareTo(quantity('100k')) == -1",
            "quantity('2G').compareTo(quantity('1G')) == 1",
            "isQuantity('1.3G')",
            "!isQuantity('1.3Gi ')",
            "quantity('50k').add(quantity('20')) == quantity('50.02k')",
            "quantity('50k').add(20) == quantity('50020')",
            "quantity('50k').sub(quantity('20')) == quantity('49.98k')",
            "quantity('50k').sub(20) == quantity('49980')",
            "quantity('50k').isInteger()",
            "!quantity('9999999999999999999999999999999999999G').isInteger()",
            "quantity('50k').asInteger() == 50000",
            "quantity('50k').asApproximateFloat() == 50000.0",
            "quantity('-50k').sign() == -1",
            "quantity('0').sign() == 0",
            "quantity('50').sign() == 1",
            "type(quantity('1')) == kubernetes.Quantity",
        ]);
        assert_error(
            "quantity('1.5x')",
            "quantities must match the regular expression",
        );
        assert_error(
            "quantity('9999999999999999999999999999999999999G').asInteger()",
            "cannot convert value to integer",
        );
    }
}
