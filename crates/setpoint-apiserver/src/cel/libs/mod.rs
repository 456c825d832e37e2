//! Kubernetes' CEL libraries, one file a library, registered on the shared environment.
//! Function names, argument types and results are upstream's (`k8s.io/apiserver/pkg/cel/library`
//! and cel-go's `ext.Sets`); errors are worded as upstream's where it words them.

pub mod authz;
mod format;
mod lists;
mod net;
mod quantity;
mod regex;
mod sets;
mod url;

use cel::common::traits::Iterable;
use cel::common::value::{CowVal, Val};
use cel::{DeclarationError, Env, ExecutionError};

/// Registers every library on `env`.
pub(super) fn register(env: &mut Env) -> Result<(), DeclarationError> {
    lists::register(env)?;
    sets::register(env)?;
    regex::register(env)?;
    url::register(env)?;
    net::register(env)?;
    quantity::register(env)?;
    format::register(env)?;
    authz::register(env)?;
    Ok(())
}

/// The elements of any CEL list.
fn elements<'b, 'v>(list: &'b (dyn Val + 'v)) -> Result<Vec<&'b (dyn Val + 'v)>, ExecutionError> {
    let iterable: &'b (dyn Iterable + 'v) =
        list.as_iterable()
            .ok_or_else(|| ExecutionError::UnexpectedType {
                got: list.get_type().name().to_owned(),
                want: "list".to_owned(),
            })?;
    let mut it = iterable.iter();
    let mut out = Vec::new();
    while let Some(v) = it.next() {
        out.push(v);
    }
    Ok(out)
}

/// The arguments of a call declared with `N` of them.
fn args<'a, 'b, 'v, const N: usize>(
    args: &'a [CowVal<'b, 'v>],
) -> Result<&'a [CowVal<'b, 'v>; N], ExecutionError> {
    args.try_into()
        .map_err(|_| ExecutionError::invalid_argument_count(N, args.len()))
}

/// Implements [`Val`] for a `'static` value type of a library: its CEL type, equality by
/// `PartialEq`, copies by `Clone`, and downcasting.
macro_rules! opaque_val {
    ($ty:ty, $cel_type:expr) => {
        impl cel::common::value::Val for $ty {
            fn get_type(&self) -> &cel::common::types::Type {
                <Self as cel::common::value::Val>::cel_type()
            }
            fn cel_type() -> &'static cel::common::types::Type {
                static T: cel::common::types::Type = $cel_type;
                &T
            }
            fn equals(&self, other: &dyn cel::common::value::Val) -> bool {
                other.downcast_ref::<$ty>().is_some_and(|o| o == self)
            }
            fn clone_as_boxed<'v>(&self) -> Box<dyn cel::common::value::Val + 'v> {
                Box::new(self.clone())
            }
            fn as_any(&self) -> Option<&dyn std::any::Any> {
                Some(self)
            }
        }
        impl cel::common::value::StaticVal for $ty {}
    };
}
use opaque_val;

#[cfg(test)]
pub(super) mod testing {
    /// Evaluates `expr` (no variables) in the shared environment.
    pub fn eval(expr: &str) -> Result<cel::Value, super::super::Error> {
        let program = super::super::compile(expr)?;
        super::super::evaluate(&program, &[], &mut super::super::Budget::per_request())
    }

    /// Asserts each expression evaluates to `true`.
    pub fn assert_true(exprs: &[&str]) {
        for e in exprs {
            assert_eq!(eval(e), Ok(cel::Value::Bool(true)), "{e}");
        }
    }

    /// Asserts `expr` fails with a message containing `needle`.
    pub fn assert_error(expr: &str, needle: &str) {
        match eval(expr) {
            Err(e) => assert!(e.to_string().contains(needle), "{expr}: {e}"),
            Ok(v) => panic!("{expr}: expected an error, got {v:?}"),
        }
    }
}
