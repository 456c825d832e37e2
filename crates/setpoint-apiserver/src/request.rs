//! Turning a request path into what it names: a discovery document, a collection, or one
//! object (with an optional subresource).

use setpoint_api::ApiError;

/// What a `/api/...` or `/apis/...` path names, before the registry is consulted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PathTarget {
    /// `/api` (legacy discovery of the core group's versions).
    CoreVersions,
    /// `/apis`.
    Groups,
    /// `/apis/<group>`.
    Group { group: String },
    /// `/api/v1` or `/apis/<group>/<version>`.
    ResourceList { group: String, version: String },
    /// A collection of a resource, in one namespace or all of them.
    Collection {
        group: String,
        version: String,
        plural: String,
        namespace: Option<String>,
    },
    /// One object, maybe a subresource of it.
    Object {
        group: String,
        version: String,
        plural: String,
        namespace: Option<String>,
        name: String,
        subresource: Option<String>,
    },
}

/// Subresources of the `namespaces` resource, which make `/api/v1/namespaces/<n>/<x>` mean
/// "subresource x of namespace n" rather than "collection x in namespace n".
const NAMESPACE_SUBRESOURCES: &[&str] = &["status", "finalize"];

/// Parses a request path (already percent-decoded per segment).
pub fn parse_path(path: &str) -> Result<PathTarget, ApiError> {
    let segs: Vec<String> = path
        .split('/')
        .filter(|s| !s.is_empty())
        .map(|s| {
            percent_encoding::percent_decode_str(s)
                .decode_utf8_lossy()
                .into_owned()
        })
        .collect();
    let segs: Vec<&str> = segs.iter().map(String::as_str).collect();
    let (group, version, rest): (&str, &str, &[&str]) = match segs.as_slice() {
        ["api"] => return Ok(PathTarget::CoreVersions),
        ["apis"] => return Ok(PathTarget::Groups),
        ["apis", g] => {
            return Ok(PathTarget::Group {
                group: g.to_string(),
            })
        }
        ["api", v, rest @ ..] => ("", v, rest),
        ["apis", g, v, rest @ ..] => (g, v, rest),
        _ => return Err(ApiError::not_found_path()),
    };
    let gv =
        |plural: &str, namespace: Option<&str>, name: Option<&str>, sub: Option<&str>| match name {
            None => PathTarget::Collection {
                group: group.into(),
                version: version.into(),
                plural: plural.into(),
                namespace: namespace.map(Into::into),
            },
            Some(name) => PathTarget::Object {
                group: group.into(),
                version: version.into(),
                plural: plural.into(),
                namespace: namespace.map(Into::into),
                name: name.into(),
                subresource: sub.map(Into::into),
            },
        };
    let target = match rest {
        [] => PathTarget::ResourceList {
            group: group.into(),
            version: version.into(),
        },
        // Namespace objects themselves and their subresources.
        ["namespaces", name, sub] if NAMESPACE_SUBRESOURCES.contains(sub) && group.is_empty() => {
            gv("namespaces", None, Some(name), Some(sub))
        }
        ["namespaces", ns, plural, tail @ ..] => match tail {
            [] => gv(plural, Some(ns), None, None),
            [name] => gv(plural, Some(ns), Some(name), None),
            [name, sub] => gv(plural, Some(ns), Some(name), Some(sub)),
            _ => return Err(ApiError::not_found_path()),
        },
        [plural] => gv(plural, None, None, None),
        [plural, name] => gv(plural, None, Some(name), None),
        [plural, name, sub] => gv(plural, None, Some(name), Some(sub)),
        _ => return Err(ApiError::not_found_path()),
    };
    Ok(target)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(g: &str, v: &str, p: &str, ns: Option<&str>, n: &str, s: Option<&str>) -> PathTarget {
        PathTarget::Object {
            group: g.into(),
            version: v.into(),
            plural: p.into(),
            namespace: ns.map(Into::into),
            name: n.into(),
            subresource: s.map(Into::into),
        }
    }

    #[test]
    fn parses_the_url_shapes() {
        assert_eq!(parse_path("/api").unwrap(), PathTarget::CoreVersions);
        assert_eq!(
            parse_path("/apis/apps").unwrap(),
            PathTarget::Group {
                group: "apps".into()
            }
        );
        assert_eq!(
            parse_path("/apis/apps/v1").unwrap(),
            PathTarget::ResourceList {
                group: "apps".into(),
                version: "v1".into()
            }
        );
        assert_eq!(
            parse_path("/api/v1/namespaces/demo/pods").unwrap(),
            PathTarget::Collection {
                group: "".into(),
                version: "v1".into(),
                plural: "pods".into(),
                namespace: Some("demo".into())
            }
        );
        assert_eq!(
            parse_path("/api/v1/namespaces/demo").unwrap(),
            obj("", "v1", "namespaces", None, "demo", None)
        );
        assert_eq!(
            parse_path("/api/v1/namespaces/demo/finalize").unwrap(),
            obj("", "v1", "namespaces", None, "demo", Some("finalize"))
        );
        assert_eq!(
            parse_path("/apis/apps/v1/namespaces/d/deployments/web/scale").unwrap(),
            obj("apps", "v1", "deployments", Some("d"), "web", Some("scale"))
        );
        assert_eq!(
            parse_path("/api/v1/nodes/n1/status").unwrap(),
            obj("", "v1", "nodes", None, "n1", Some("status"))
        );
        assert!(parse_path("/foo").is_err());
    }
}
