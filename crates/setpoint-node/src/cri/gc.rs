//! Image and container garbage collection and the node's image list, as the kubelet's image
//! manager and container garbage collector do them.
//!
//! - When the image filesystem's usage (its used share of capacity, from `statvfs` of the
//!   mount point CRI `ImageFsInfo` names) reaches `--image-gc-high-threshold` (85 %), unused
//!   images are removed, least recently used first (then the earliest detected), until the
//!   usage would be at `--image-gc-low-threshold` (80 %). An image in use by a container,
//!   pinned by the runtime (the sandbox image) or first seen less than
//!   `--minimum-image-ttl-duration` (2 min) ago is never removed.
//! - `status.images` lists the node's images, largest first, at most 50, each with at most
//!   5 names (digests, then tags).
//!
//! - Exited containers: of each container of each pod, the two most recent runs stay (the
//!   running one and the dead one `kubectl logs --previous` reads), older exited ones go
//!   ([`dead_containers_to_remove`]); everything of a pod that is gone goes when the agent
//!   kills it.
//!
//! The choices are pure functions ([`images_to_free`], [`node_images`],
//! [`dead_containers_to_remove`]); the runtime feeds
//! them what CRI reports and what it remembers of each image's use.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::ContainerImage;

use super::api as cri;

/// The kubelet's `--image-gc-high-threshold` default, in percent.
pub const DEFAULT_HIGH_THRESHOLD: u8 = 85;
/// The kubelet's `--image-gc-low-threshold` default, in percent.
pub const DEFAULT_LOW_THRESHOLD: u8 = 80;
/// The kubelet's `--minimum-image-ttl-duration` default.
pub const DEFAULT_MINIMUM_AGE: std::time::Duration = std::time::Duration::from_secs(120);
/// At most this many images in `status.images` (the kubelet's `nodeStatusMaxImages`).
pub const MAX_NODE_IMAGES: usize = 50;
/// At most this many names per image in `status.images`.
pub const MAX_NAMES_PER_IMAGE: usize = 5;

/// What the collector knows of one image.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageRecord {
    /// The CRI image id.
    pub id: String,
    /// Its size in bytes.
    pub size: u64,
    /// Pinned by the runtime (the sandbox image): never removed.
    pub pinned: bool,
    /// A container (running or not) uses it: never removed.
    pub in_use: bool,
    /// When a container last used it (seconds on any monotonic scale); its first detection
    /// when none has.
    pub last_used: u64,
    /// When it was first seen, on the same scale.
    pub first_detected: u64,
}

/// The image filesystem's size and what is free on it, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FsUsage {
    /// Total bytes.
    pub capacity: u64,
    /// Bytes free to unprivileged users.
    pub available: u64,
}

impl FsUsage {
    /// The used share, in whole percent (rounded down, as the kubelet computes it).
    pub fn percent_used(&self) -> u64 {
        if self.capacity == 0 {
            return 0;
        }
        self.capacity.saturating_sub(self.available) * 100 / self.capacity
    }
}

/// The images to remove, in order, so that usage falls to `low` percent once it has reached
/// `high`; none below `high`. `now` and `minimum_age` are on [`ImageRecord`]'s scale.
pub fn images_to_free(
    images: &[ImageRecord],
    usage: FsUsage,
    high: u8,
    low: u8,
    now: u64,
    minimum_age: u64,
) -> Vec<String> {
    if usage.capacity == 0 || usage.percent_used() < u64::from(high) {
        return Vec::new();
    }
    // Bytes to free so that what is available reaches (100 - low) % of the capacity.
    let target_available =
        (u128::from(usage.capacity) * u128::from(100 - low.min(100)) / 100) as u64;
    let mut to_free = target_available.saturating_sub(usage.available);
    let mut candidates: Vec<&ImageRecord> = images
        .iter()
        .filter(|i| !i.in_use && !i.pinned)
        .filter(|i| now.saturating_sub(i.first_detected) >= minimum_age)
        .collect();
    candidates.sort_by_key(|i| (i.last_used, i.first_detected));
    let mut out = Vec::new();
    for image in candidates {
        if to_free == 0 {
            break;
        }
        out.push(image.id.clone());
        to_free = to_free.saturating_sub(image.size);
    }
    out
}

/// `status.images` from CRI's images: largest first, at most [`MAX_NODE_IMAGES`], names
/// being the digests then the tags, at most [`MAX_NAMES_PER_IMAGE`]; images without a name
/// are left out.
pub fn node_images(images: &[cri::Image]) -> Vec<ContainerImage> {
    let mut sorted: Vec<&cri::Image> = images.iter().collect();
    sorted.sort_by(|a, b| b.size.cmp(&a.size).then_with(|| a.id.cmp(&b.id)));
    sorted
        .into_iter()
        .filter_map(|i| {
            let names: Vec<String> = i
                .repo_digests
                .iter()
                .chain(&i.repo_tags)
                .take(MAX_NAMES_PER_IMAGE)
                .cloned()
                .collect();
            (!names.is_empty()).then(|| ContainerImage {
                names: Some(names),
                size_bytes: Some(i64::try_from(i.size).unwrap_or(i64::MAX)),
            })
        })
        .take(MAX_NODE_IMAGES)
        .collect()
}

/// The exited containers to remove, as the kubelet's container garbage collection with
/// its defaults (`MaxPerPodContainer` 1): of each container of each pod, the two most
/// recent runs stay, which is the running one and one dead one (for `lastState` and
/// `kubectl logs --previous`), or, while it waits to restart, the exited latest run and
/// the one before it, which `--previous` reads then; older exited runs go. Running and
/// created containers are never chosen. Containers without a pod's labels are not the
/// node's and are left alone.
pub fn dead_containers_to_remove(containers: &[cri::Container]) -> Vec<String> {
    use super::sandbox::{CONTAINER_NAME_LABEL, POD_UID_LABEL};
    let mut runs: HashMap<(&str, &str), Vec<&cri::Container>> = HashMap::new();
    for c in containers {
        let (Some(uid), Some(name)) = (
            c.labels.get(POD_UID_LABEL),
            c.labels.get(CONTAINER_NAME_LABEL),
        ) else {
            continue;
        };
        runs.entry((uid, name)).or_default().push(c);
    }
    let mut out: Vec<String> = Vec::new();
    for mut all in runs.into_values() {
        all.sort_by_key(|c| {
            std::cmp::Reverse((c.metadata.as_ref().map_or(0, |m| m.attempt), c.created_at))
        });
        out.extend(
            all.iter()
                .skip(2)
                .filter(|c| c.state == cri::ContainerState::ContainerExited as i32)
                .map(|c| c.id.clone()),
        );
    }
    out.sort();
    out
}

/// What the collector remembers between rounds: when each image was first seen and last
/// used.
#[derive(Debug, Default)]
pub struct ImageUse {
    seen: HashMap<String, (u64, u64)>,
}

impl ImageUse {
    /// Records a round at `now`: every image present is seen, the ones in `in_use` used;
    /// images no longer present are forgotten. Returns the records for [`images_to_free`].
    pub fn observe(
        &mut self,
        images: &[cri::Image],
        in_use: &std::collections::HashSet<String>,
        now: u64,
    ) -> Vec<ImageRecord> {
        self.seen.retain(|id, _| images.iter().any(|i| &i.id == id));
        images
            .iter()
            .map(|i| {
                let used = in_use.contains(&i.id);
                let entry = self.seen.entry(i.id.clone()).or_insert((now, now));
                if used {
                    entry.1 = now;
                }
                ImageRecord {
                    id: i.id.clone(),
                    size: i.size,
                    pinned: i.pinned,
                    in_use: used,
                    last_used: entry.1,
                    first_detected: entry.0,
                }
            })
            .collect()
    }
}

/// The size and free space of the filesystem holding `path`.
#[allow(unsafe_code)]
pub fn fs_usage(path: &std::path::Path) -> std::io::Result<FsUsage> {
    use std::os::unix::ffi::OsStrExt;
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c_path` is a NUL-terminated string and `stat` a valid, writable statvfs that
    // outlives the call.
    if unsafe { libc::statvfs(c_path.as_ptr(), &mut stat) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let block = stat.f_frsize as u64;
    Ok(FsUsage {
        capacity: stat.f_blocks as u64 * block,
        available: stat.f_bavail as u64 * block,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(id: &str, size: u64, last_used: u64) -> ImageRecord {
        ImageRecord {
            id: id.into(),
            size,
            pinned: false,
            in_use: false,
            last_used,
            first_detected: 0,
        }
    }

    const GB: u64 = 1_000_000_000;

    #[test]
    fn nothing_goes_below_the_high_threshold() {
        let usage = FsUsage {
            capacity: 100 * GB,
            available: 16 * GB,
        };
        assert_eq!(usage.percent_used(), 84);
        let images = [rec("a", 10 * GB, 1)];
        assert!(images_to_free(&images, usage, 85, 80, 1000, 120).is_empty());
    }

    #[test]
    fn least_recently_used_go_first_until_the_low_threshold() {
        // 90 % used: 10 GB free, 20 GB must be: 10 GB to free.
        let usage = FsUsage {
            capacity: 100 * GB,
            available: 10 * GB,
        };
        let mut in_use = rec("used", 50 * GB, 0);
        in_use.in_use = true;
        let mut pause = rec("pause", 50 * GB, 0);
        pause.pinned = true;
        let mut young = rec("young", 50 * GB, 0);
        young.first_detected = 950;
        let images = [
            rec("recent", 6 * GB, 500),
            rec("old", 6 * GB, 100),
            rec("older", 3 * GB, 50),
            rec("newest", 6 * GB, 900),
            in_use,
            pause,
            young,
        ];
        assert_eq!(
            images_to_free(&images, usage, 85, 80, 1000, 120),
            ["older", "old", "recent"]
        );
    }

    #[test]
    fn everything_unused_goes_if_that_is_not_enough() {
        let usage = FsUsage {
            capacity: 100 * GB,
            available: 0,
        };
        let images = [rec("a", GB, 2), rec("b", GB, 1)];
        assert_eq!(
            images_to_free(&images, usage, 85, 80, 1000, 120),
            ["b", "a"]
        );
    }

    #[test]
    fn use_is_remembered_between_rounds() {
        let image = |id: &str| cri::Image {
            id: id.into(),
            size: 1,
            ..Default::default()
        };
        let mut memory = ImageUse::default();
        let used: std::collections::HashSet<String> = ["a".to_string()].into();
        let first = memory.observe(&[image("a"), image("b")], &used, 10);
        assert_eq!((first[0].last_used, first[1].last_used), (10, 10));
        let second = memory.observe(&[image("a"), image("b")], &Default::default(), 20);
        assert_eq!(second[0].last_used, 10);
        assert_eq!(second[1].first_detected, 10);
        assert!(!second[0].in_use);
        // Gone and back: detected anew.
        memory.observe(&[image("a")], &Default::default(), 30);
        let back = memory.observe(&[image("a"), image("b")], &Default::default(), 40);
        assert_eq!(back[1].first_detected, 40);
    }

    #[test]
    fn node_images_are_largest_first_and_bounded() {
        let mut images: Vec<cri::Image> = (0..60)
            .map(|n| cri::Image {
                id: format!("sha256:{n}"),
                size: n,
                repo_tags: vec![format!("img{n}:1")],
                repo_digests: vec![format!("img{n}@sha256:{n}")],
                ..Default::default()
            })
            .collect();
        images.push(cri::Image {
            id: "nameless".into(),
            size: 1000,
            ..Default::default()
        });
        images[0].repo_tags = (0..8).map(|t| format!("many:{t}")).collect();
        images[0].size = 500;
        let listed = node_images(&images);
        assert_eq!(listed.len(), MAX_NODE_IMAGES);
        assert_eq!(listed[0].size_bytes, Some(500));
        assert_eq!(listed[0].names.as_ref().unwrap().len(), MAX_NAMES_PER_IMAGE);
        assert_eq!(listed[0].names.as_ref().unwrap()[0], "img0@sha256:0");
        assert_eq!(listed[1].size_bytes, Some(59));
        assert_eq!(
            listed[1].names.clone().unwrap(),
            ["img59@sha256:59", "img59:1"]
        );
    }

    #[test]
    fn one_exited_run_per_container_stays() {
        let run = |id: &str, uid: &str, name: &str, attempt: u32, state: cri::ContainerState| {
            cri::Container {
                id: id.into(),
                metadata: Some(cri::ContainerMetadata {
                    name: name.into(),
                    attempt,
                }),
                state: state as i32,
                created_at: i64::from(attempt),
                labels: [
                    ("io.kubernetes.pod.uid".to_string(), uid.to_string()),
                    ("io.kubernetes.container.name".to_string(), name.to_string()),
                ]
                .into(),
                ..Default::default()
            }
        };
        use cri::ContainerState::{ContainerExited as Exited, ContainerRunning as Running};
        let mut foreign = run("foreign", "", "", 0, Exited);
        foreign.labels.clear();
        let containers = [
            run("a0", "p1", "app", 0, Exited),
            run("a1", "p1", "app", 1, Exited),
            run("a2", "p1", "app", 2, Exited),
            run("a3", "p1", "app", 3, Running),
            run("s0", "p1", "side", 0, Exited),
            // Waiting to restart: the latest exited run and the one before it stay.
            run("b0", "p2", "app", 0, Exited),
            run("b1", "p2", "app", 1, Exited),
            run("b2", "p2", "app", 2, Exited),
            foreign.clone(),
            foreign,
        ];
        assert_eq!(dead_containers_to_remove(&containers), ["a0", "a1", "b0"]);
    }

    #[test]
    fn the_filesystem_of_a_directory_has_a_size() {
        let usage = fs_usage(&std::env::temp_dir()).unwrap();
        assert!(usage.capacity > 0 && usage.available <= usage.capacity);
    }
}
