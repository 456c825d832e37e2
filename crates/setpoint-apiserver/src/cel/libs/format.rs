//! Kubernetes' format library (`k8s.io/apiserver/pkg/cel/library/format.go`): named string
//! formats, `format.<name>()` or `format.named(name)`, whose `validate(s)` is an optional
//! list of what is wrong with `s` (`optional.none()` when it is valid). The name rules and
//! their messages are `setpoint_api::names`', the ones object validation uses.

use cel::common::types::{CelList, CelOptional, CelString};
use cel::common::value::Val;
use cel::{DeclarationError, Env};
use setpoint_api::names;

use super::opaque_val;

/// A CEL value of type `kubernetes.NamedFormat`.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct CelFormat(&'static str);

opaque_val!(
    CelFormat,
    cel::common::types::Type::new_unspecified_type("kubernetes.NamedFormat")
);

/// The formats by name, upstream's set.
const FORMATS: &[&str] = &[
    "dns1123Label",
    "dns1123Subdomain",
    "dns1035Label",
    "qualifiedName",
    "dns1123LabelPrefix",
    "dns1123SubdomainPrefix",
    "dns1035LabelPrefix",
    "labelValue",
    "uri",
    "uuid",
    "byte",
    "date",
    "datetime",
];

macro_rules! named {
    ($($f:ident => $name:literal),* $(,)?) => {
        $(fn $f() -> CelFormat { CelFormat($name) })*
        fn register_named(env: &mut Env) -> Result<(), DeclarationError> {
            $(cel::add_overload!(env, fn $f: () -> CelFormat,
                name = concat!("format.", $name), id = concat!("format-", $name))?;)*
            Ok(())
        }
    };
}

named! {
    dns1123_label => "dns1123Label",
    dns1123_subdomain => "dns1123Subdomain",
    dns1035_label => "dns1035Label",
    qualified_name => "qualifiedName",
    dns1123_label_prefix => "dns1123LabelPrefix",
    dns1123_subdomain_prefix => "dns1123SubdomainPrefix",
    dns1035_label_prefix => "dns1035LabelPrefix",
    label_value => "labelValue",
    uri => "uri",
    uuid => "uuid",
    byte => "byte",
    date => "date",
    datetime => "datetime",
}

pub(super) fn register(env: &mut Env) -> Result<(), DeclarationError> {
    env.add_type(cel::common::types::Type::new_unspecified_type(
        "kubernetes.NamedFormat",
    ))?;
    register_named(env)?;
    cel::add_overload!(env, fn named: (CelString) -> CelOptional<'static>,
        name = "format.named", id = "format-named")?;
    cel::add_member_overload!(env, fn validate: (CelFormat, CelString) -> CelOptional<'static>,
        id = "format-validate")?;
    Ok(())
}

fn named(name: &CelString<'_>) -> CelOptional<'static> {
    match FORMATS.iter().find(|f| **f == name.inner()) {
        Some(f) => CelOptional::of(Box::new(CelFormat(f))),
        None => CelOptional::none(),
    }
}

/// A generated name's prefix is checked as a name whose trailing dash is a letter
/// (upstream's `maskTrailingDash`).
fn masked(s: &str) -> String {
    match s.strip_suffix('-') {
        Some(rest) if !rest.is_empty() => format!("{rest}a"),
        _ => s.to_string(),
    }
}

fn problems(format: &str, s: &str) -> Result<(), Vec<String>> {
    let one = |ok: bool, message: &str| {
        if ok {
            Ok(())
        } else {
            Err(vec![message.to_string()])
        }
    };
    match format {
        "dns1123Label" => names::is_dns1123_label(s),
        "dns1123Subdomain" => names::is_dns1123_subdomain(s),
        "dns1035Label" => names::is_dns1035_label(s),
        "qualifiedName" => names::is_qualified_name(s),
        "dns1123LabelPrefix" => names::is_dns1123_label(&masked(s)),
        "dns1123SubdomainPrefix" => names::is_dns1123_subdomain(&masked(s)),
        "dns1035LabelPrefix" => names::is_dns1035_label(&masked(s)),
        "labelValue" => names::is_valid_label_value(s),
        "uri" => super::url::parse(s)
            .map(|_| ())
            .map_err(|e| vec![format!("parse {s:?}: {e}")]),
        "uuid" => one(
            uuid::Uuid::try_parse(s).is_ok(),
            "does not match the UUID format",
        ),
        "byte" => {
            use base64::Engine;
            one(
                base64::engine::general_purpose::STANDARD.decode(s).is_ok(),
                "invalid base64",
            )
        }
        "date" => one(
            chrono::NaiveDate::parse_from_str(s, "%Y-%m-%d").is_ok(),
            "invalid date",
        ),
        "datetime" => one(
            chrono::DateTime::parse_from_rfc3339(s).is_ok(),
            "invalid datetime",
        ),
        _ => Ok(()),
    }
}

fn validate(format: &CelFormat, s: &CelString<'_>) -> CelOptional<'static> {
    match problems(format.0, s.inner()) {
        Ok(()) => CelOptional::none(),
        Err(messages) => {
            let list: Vec<Box<dyn Val>> = messages
                .into_iter()
                .map(|m| Box::new(CelString::from(m)) as Box<dyn Val>)
                .collect();
            CelOptional::of(Box::new(CelList::from(list)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::assert_true;

    /// Upstream's documented examples (the format library table of "CEL in Kubernetes").
    #[test]
    fn documented_examples() {
        assert_true(&[
            "!format.dns1123Label().validate('my-label-name').hasValue()",
            "format.dns1123Label().validate('MY_LABEL').hasValue()",
            "format.dns1123Label().validate('MY_LABEL').value().size() == 1",
            "format.dns1123Label().validate('MY_LABEL').value()[0].startsWith(\"a lowercase RFC 1123 label must consist of\")",
            "!format.dns1123Subdomain().validate('a.b.c').hasValue()",
            "!format.dns1123LabelPrefix().validate('my-prefix-').hasValue()",
            "format.dns1123Label().validate('my-prefix-').hasValue()",
            "!format.qualifiedName().validate('example.com/name').hasValue()",
            "!format.labelValue().validate('').hasValue()",
            "!format.uuid().validate('123e4567-e89b-12d3-a456-426614174000').hasValue()",
            "format.uuid().validate('nope').hasValue()",
            "!format.uri().validate('https://example.com/').hasValue()",
            "format.uri().validate('../x').hasValue()",
            "!format.date().validate('2024-02-29').hasValue()",
            "format.datetime().validate('2024-02-29').hasValue()",
            "!format.byte().validate('aGVsbG8=').hasValue()",
            "format.named('dns1123Label').hasValue()",
            "!format.named('nope').hasValue()",
            "!format.named('dns1035Label').value().validate('abc').hasValue()",
            "format.named('dns1035Label').value().validate('1abc').hasValue()",
        ]);
    }
}
