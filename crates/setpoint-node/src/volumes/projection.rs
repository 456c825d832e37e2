//! The payloads of the volumes the kubelet writes with its atomic writer ([`super::writer`]):
//! `configMap`, `secret`, `downwardAPI` and `projected`. Pure: the objects are read by the
//! caller ([`super::manager`]), and a missing one is passed as `None`.

use k8s_openapi::api::core::v1::{ConfigMap, DownwardAPIVolumeFile, KeyToPath, Pod, Secret};

use super::downward;
use super::writer::{FileProjection, Payload};
use crate::agent::Capacity;

/// The mode of a projected file when the volume names none (`0644`, the API's default).
pub const DEFAULT_MODE: u32 = 0o644;

/// The mode of a projected service-account token when the pod has an `fsGroup`: readable
/// by its owner only, then by the group as [`with_fs_group`] adds (upstream's 0600 then
/// 0640).
pub const TOKEN_MODE_WITH_FS_GROUP: u32 = 0o600;

/// A volume's `defaultMode`, or [`DEFAULT_MODE`].
pub fn default_mode(mode: Option<i32>) -> u32 {
    mode.map_or(DEFAULT_MODE, |m| (m as u32) & 0o7777)
}

fn mode_of(item: Option<i32>, default: u32) -> u32 {
    item.map_or(default, |m| (m as u32) & 0o7777)
}

/// A ConfigMap's payload as the kubelet makes it: every key of `data` and `binaryData`, or
/// only `items` (each at its `path`, with its `mode`). A key `items` names that the
/// ConfigMap lacks is an error unless the source is optional.
pub fn config_map(
    cm: &ConfigMap,
    items: Option<&[KeyToPath]>,
    default_mode: u32,
    optional: bool,
) -> Result<Payload, String> {
    let text = cm.data.as_ref();
    let binary = cm.binary_data.as_ref();
    let mut payload = Payload::new();
    let items = items.unwrap_or_default();
    if items.is_empty() {
        for (k, v) in text.into_iter().flatten() {
            payload.insert(k.clone(), file(v.as_bytes().to_vec(), default_mode));
        }
        for (k, v) in binary.into_iter().flatten() {
            payload.insert(k.clone(), file(v.0.clone(), default_mode));
        }
        return Ok(payload);
    }
    for item in items {
        let data = if let Some(v) = text.and_then(|d| d.get(&item.key)) {
            v.as_bytes().to_vec()
        } else if let Some(v) = binary.and_then(|d| d.get(&item.key)) {
            v.0.clone()
        } else if optional {
            continue;
        } else {
            return Err(format!(
                "configmap references non-existent config key: {}",
                item.key
            ));
        };
        payload.insert(
            item.path.clone(),
            file(data, mode_of(item.mode, default_mode)),
        );
    }
    Ok(payload)
}

/// A Secret's payload, as [`config_map`]'s but of `data`.
pub fn secret(
    secret: &Secret,
    items: Option<&[KeyToPath]>,
    default_mode: u32,
    optional: bool,
) -> Result<Payload, String> {
    let data = secret.data.as_ref();
    let mut payload = Payload::new();
    let items = items.unwrap_or_default();
    if items.is_empty() {
        for (k, v) in data.into_iter().flatten() {
            payload.insert(k.clone(), file(v.0.clone(), default_mode));
        }
        return Ok(payload);
    }
    for item in items {
        match data.and_then(|d| d.get(&item.key)) {
            Some(v) => {
                payload.insert(
                    item.path.clone(),
                    file(v.0.clone(), mode_of(item.mode, default_mode)),
                );
            }
            None if optional => {}
            None => return Err(format!("references non-existent secret key: {}", item.key)),
        }
    }
    Ok(payload)
}

/// A downwardAPI payload: each item's field or resource. Items that fail are left out and
/// their errors returned together (upstream's aggregate), so one bad item names itself.
pub fn downward_api(
    pod: &Pod,
    items: &[DownwardAPIVolumeFile],
    default_mode: u32,
    allocatable: &Capacity,
) -> Result<Payload, String> {
    let mut payload = Payload::new();
    let mut errors = Vec::new();
    for item in items {
        let value = if let Some(f) = &item.field_ref {
            downward::field_value(pod, f)
        } else if let Some(r) = &item.resource_field_ref {
            downward::resource_value(pod, r, allocatable)
        } else {
            Ok(String::new())
        };
        match value {
            Ok(v) => {
                payload.insert(
                    item.path.clone(),
                    file(v.into_bytes(), mode_of(item.mode, default_mode)),
                );
            }
            Err(e) => errors.push(e),
        }
    }
    if errors.is_empty() {
        Ok(payload)
    } else {
        Err(aggregate(&errors))
    }
}

/// Several errors as upstream's `utilerrors.NewAggregate` prints them: one alone as itself,
/// more as `[a, b]`.
pub fn aggregate(errors: &[String]) -> String {
    match errors {
        [one] => one.clone(),
        many => format!("[{}]", many.join(", ")),
    }
}

/// `payload` owned by the pod's `fsGroup`, readable by it, as the kubelet's volume
/// ownership change leaves a read-only volume (group set, `0440` added).
pub fn with_fs_group(payload: &mut Payload, fs_group: Option<i64>) {
    let Some(gid) = fs_group.and_then(|g| u32::try_from(g).ok()) else {
        return;
    };
    for f in payload.values_mut() {
        f.gid = Some(gid);
        f.mode |= 0o440;
    }
}

fn file(data: Vec<u8>, mode: u32) -> FileProjection {
    FileProjection {
        data,
        mode,
        gid: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;
    use std::collections::BTreeMap;

    fn cm() -> ConfigMap {
        ConfigMap {
            data: Some(BTreeMap::from([
                ("app.conf".to_string(), "port=1".to_string()),
                ("other".to_string(), "x".to_string()),
            ])),
            binary_data: Some(BTreeMap::from([(
                "blob".to_string(),
                ByteString(vec![0, 1]),
            )])),
            ..Default::default()
        }
    }

    fn item(key: &str, path: &str, mode: Option<i32>) -> KeyToPath {
        KeyToPath {
            key: key.into(),
            path: path.into(),
            mode,
        }
    }

    #[test]
    fn config_maps_give_every_key_or_the_items() {
        let all = config_map(&cm(), None, 0o644, false).unwrap();
        assert_eq!(
            all.keys().collect::<Vec<_>>(),
            ["app.conf", "blob", "other"]
        );
        assert_eq!(all["blob"].data, [0, 1]);
        let items = [item("app.conf", "conf/app", Some(0o400))];
        let some = config_map(&cm(), Some(&items), 0o644, false).unwrap();
        assert_eq!(some.len(), 1);
        assert_eq!(some["conf/app"].mode, 0o400);
        let missing = [item("nope", "n", None)];
        assert_eq!(
            config_map(&cm(), Some(&missing), 0o644, false).unwrap_err(),
            "configmap references non-existent config key: nope"
        );
        assert!(config_map(&cm(), Some(&missing), 0o644, true)
            .unwrap()
            .is_empty());
    }

    #[test]
    fn secrets_name_a_missing_key() {
        let s = Secret {
            data: Some(BTreeMap::from([(
                "password".to_string(),
                ByteString(b"hunter2".to_vec()),
            )])),
            ..Default::default()
        };
        assert_eq!(
            secret(&s, None, 0o600, false).unwrap()["password"].mode,
            0o600
        );
        let missing = [item("user", "u", None)];
        assert_eq!(
            secret(&s, Some(&missing), 0o644, false).unwrap_err(),
            "references non-existent secret key: user"
        );
    }

    #[test]
    fn fs_group_makes_files_group_readable() {
        let mut p = config_map(&cm(), None, TOKEN_MODE_WITH_FS_GROUP, false).unwrap();
        with_fs_group(&mut p, Some(2000));
        assert_eq!(p["other"].mode, 0o640);
        assert_eq!(p["other"].gid, Some(2000));
        assert_eq!(aggregate(&["a".into(), "b".into()]), "[a, b]");
    }
}
