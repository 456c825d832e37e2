//! Image decisions, as the kubelet's image manager makes them: which `imagePullPolicy`
//! applies (upstream's default by tag when the pod does not say), whether to pull, and the
//! per-image back-off after a failed pull (`ErrImagePull`, then `ImagePullBackOff` until the
//! delay passes, then a new attempt). Pure: the runtime asks CRI whether the image is
//! present and does the pull.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Container;

/// The kubelet's first image-pull back-off delay.
pub const PULL_BACKOFF_BASE: Duration = Duration::from_secs(10);
/// The kubelet's image-pull back-off ceiling.
pub const PULL_BACKOFF_MAX: Duration = Duration::from_secs(300);

/// `imagePullPolicy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PullPolicy {
    /// Pull before every container start.
    Always,
    /// Pull only when the image is absent.
    IfNotPresent,
    /// Never pull; an absent image is an error.
    Never,
}

/// The tag of an image reference: what follows the last `:` of its last path component,
/// `latest` when there is neither tag nor digest (as the reference parser upstream
/// defaults it), empty for a digest-only reference.
pub fn image_tag(image: &str) -> String {
    let (name, digest) = match image.split_once('@') {
        Some((name, digest)) => (name, Some(digest)),
        None => (image, None),
    };
    let last = name.rsplit('/').next().unwrap_or(name);
    match last.rsplit_once(':') {
        Some((_, tag)) => tag.to_string(),
        None if digest.is_some() => String::new(),
        None => "latest".to_string(),
    }
}

/// The container's pull policy: the one it names, else upstream's default (`Always` for
/// the tag `latest` or no tag, `IfNotPresent` otherwise). An unknown value is an error.
pub fn pull_policy(container: &Container) -> Result<PullPolicy, String> {
    match container.image_pull_policy.as_deref() {
        Some("Always") => Ok(PullPolicy::Always),
        Some("IfNotPresent") => Ok(PullPolicy::IfNotPresent),
        Some("Never") => Ok(PullPolicy::Never),
        None | Some("") => {
            let image = container.image.as_deref().unwrap_or_default();
            Ok(if image_tag(image) == "latest" {
                PullPolicy::Always
            } else {
                PullPolicy::IfNotPresent
            })
        }
        Some(other) => Err(format!("unknown imagePullPolicy {other:?}")),
    }
}

/// What to do about a container's image.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ImageAction {
    /// The image is there and need not be pulled.
    Use,
    /// Pull it.
    Pull,
    /// It cannot be had: the container waits with this reason and message.
    Wait {
        /// `ErrImageNeverPull`.
        reason: &'static str,
        /// Why, in the kubelet's words.
        message: String,
    },
}

/// Whether to pull, given the policy and whether CRI already has the image.
pub fn decide(image: &str, policy: PullPolicy, present: bool) -> ImageAction {
    match (policy, present) {
        (PullPolicy::Always, _) | (PullPolicy::IfNotPresent, false) => ImageAction::Pull,
        (_, true) => ImageAction::Use,
        (PullPolicy::Never, false) => ImageAction::Wait {
            reason: "ErrImageNeverPull",
            message: format!(
                "Container image \"{image}\" is not present with pull policy of Never"
            ),
        },
    }
}

/// The waiting message of a failed pull (`ErrImagePull`), as the kubelet words it.
pub fn pull_error_message(image: &str, error: &str) -> String {
    format!("Failed to pull image \"{image}\": {error}")
}

#[derive(Clone, Debug)]
struct Failure {
    at: Instant,
    delay: Duration,
    message: String,
}

/// Failed pulls per (pod uid, image), and the delay before the next attempt: 10 s doubling
/// to 5 min, as the kubelet's. While a delay runs the container waits with
/// `ImagePullBackOff`.
#[derive(Debug, Default)]
pub struct PullBackoff {
    failures: HashMap<(String, String), Failure>,
}

impl PullBackoff {
    /// If a pull of `image` for pod `uid` is backing off at `now`: the `ImagePullBackOff`
    /// message (`Back-off pulling image "<image>": <previous error>`) and when it ends.
    pub fn check(&self, uid: &str, image: &str, now: Instant) -> Option<(String, Instant)> {
        let f = self.failures.get(&(uid.to_string(), image.to_string()))?;
        let until = f.at + f.delay;
        (now < until).then(|| {
            (
                format!("Back-off pulling image \"{image}\": {}", f.message),
                until,
            )
        })
    }

    /// Records a failed pull at `now` with its `ErrImagePull` message; the next attempt waits
    /// the doubled delay (the first one 10 s). A failure long after the last (twice the
    /// ceiling) starts over, as upstream's back-off does.
    pub fn failed(&mut self, uid: &str, image: &str, message: String, now: Instant) {
        let key = (uid.to_string(), image.to_string());
        let delay = match self.failures.get(&key) {
            Some(f) if now.saturating_duration_since(f.at) < 2 * PULL_BACKOFF_MAX => {
                (f.delay * 2).min(PULL_BACKOFF_MAX)
            }
            _ => PULL_BACKOFF_BASE,
        };
        self.failures.insert(
            key,
            Failure {
                at: now,
                delay,
                message,
            },
        );
    }

    /// A pull succeeded: forget its failures.
    pub fn succeeded(&mut self, uid: &str, image: &str) {
        self.failures.remove(&(uid.to_string(), image.to_string()));
    }

    /// Forgets everything about a pod (it was killed).
    pub fn forget_pod(&mut self, uid: &str) {
        self.failures.retain(|(u, _), _| u != uid);
    }

    /// Whether a back-off of pod `uid` ended in the `window` before `now`: the monitor,
    /// looking once per window, wakes the pod's sync for the next pull attempt.
    pub fn expired_since(&self, uid: &str, now: Instant, window: Duration) -> bool {
        self.failures.iter().any(|((u, _), f)| {
            let until = f.at + f.delay;
            u == uid && until <= now && now.saturating_duration_since(until) < window
        })
    }

    /// When the earliest running back-off of pod `uid` ends, for waking its sync then.
    pub fn next_expiry(&self, uid: &str, now: Instant) -> Option<Instant> {
        self.failures
            .iter()
            .filter(|((u, _), _)| u == uid)
            .map(|(_, f)| f.at + f.delay)
            .filter(|until| *until > now)
            .min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn container(image: &str, policy: Option<&str>) -> Container {
        Container {
            name: "c".into(),
            image: Some(image.into()),
            image_pull_policy: policy.map(String::from),
            ..Default::default()
        }
    }

    #[test]
    fn tags_are_parsed_like_upstream() {
        assert_eq!(image_tag("busybox"), "latest");
        assert_eq!(image_tag("busybox:1.36"), "1.36");
        assert_eq!(image_tag("registry:5000/team/app"), "latest");
        assert_eq!(image_tag("registry:5000/team/app:v2"), "v2");
        assert_eq!(image_tag("app@sha256:abcd"), "");
        assert_eq!(image_tag("app:v1@sha256:abcd"), "v1");
    }

    #[test]
    fn default_policy_follows_the_tag() {
        let p = |image: &str, policy| pull_policy(&container(image, policy)).unwrap();
        assert_eq!(p("busybox", None), PullPolicy::Always);
        assert_eq!(p("busybox:latest", None), PullPolicy::Always);
        assert_eq!(p("busybox:1", None), PullPolicy::IfNotPresent);
        assert_eq!(p("busybox@sha256:ab", None), PullPolicy::IfNotPresent);
        assert_eq!(p("busybox:1", Some("Always")), PullPolicy::Always);
        assert_eq!(p("busybox", Some("Never")), PullPolicy::Never);
        assert_eq!(p("busybox", Some("IfNotPresent")), PullPolicy::IfNotPresent);
        assert!(pull_policy(&container("b", Some("Sometimes"))).is_err());
    }

    #[test]
    fn pull_decisions() {
        assert_eq!(decide("b", PullPolicy::Always, true), ImageAction::Pull);
        assert_eq!(
            decide("b", PullPolicy::IfNotPresent, true),
            ImageAction::Use
        );
        assert_eq!(
            decide("b", PullPolicy::IfNotPresent, false),
            ImageAction::Pull
        );
        assert_eq!(decide("b", PullPolicy::Never, true), ImageAction::Use);
        assert_eq!(
            decide("x:1", PullPolicy::Never, false),
            ImageAction::Wait {
                reason: "ErrImageNeverPull",
                message: "Container image \"x:1\" is not present with pull policy of Never".into()
            }
        );
    }

    #[test]
    fn failed_pulls_back_off_doubling() {
        let mut b = PullBackoff::default();
        let t0 = Instant::now();
        assert!(b.check("u", "x", t0).is_none());
        b.failed("u", "x", "boom".into(), t0);
        let (msg, until) = b.check("u", "x", t0 + Duration::from_secs(1)).unwrap();
        assert_eq!(msg, "Back-off pulling image \"x\": boom");
        assert_eq!(until, t0 + Duration::from_secs(10));
        assert!(b.check("u", "x", t0 + Duration::from_secs(10)).is_none());
        assert!(b.check("other", "x", t0).is_none());
        let t1 = t0 + Duration::from_secs(10);
        b.failed("u", "x", "boom".into(), t1);
        assert_eq!(
            b.check("u", "x", t1).unwrap().1,
            t1 + Duration::from_secs(20)
        );
        assert_eq!(b.next_expiry("u", t1), Some(t1 + Duration::from_secs(20)));
        assert!(b.expired_since(
            "u",
            t1 + Duration::from_millis(20_500),
            Duration::from_secs(1)
        ));
        assert!(!b.expired_since("u", t1 + Duration::from_secs(22), Duration::from_secs(1)));
        b.succeeded("u", "x");
        assert!(b.check("u", "x", t1).is_none());
    }
}
