//! The allocator tuning `setpoint` applies as it starts (`tune_allocator` in `src/main.rs`),
//! checked through mimalloc's own report of its options, so that a mimalloc upgrade that
//! renumbers them fails here rather than silently tuning something else.
#![cfg(feature = "mimalloc")]

use std::process::Command;

/// The purge delay mimalloc reports for a `setpoint` started with `env`.
fn reported_purge_delay(env: Option<&str>) -> String {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_setpoint"));
    cmd.arg("--version")
        .env("MIMALLOC_VERBOSE", "1")
        .env_remove("MIMALLOC_PURGE_DELAY");
    if let Some(value) = env {
        cmd.env("MIMALLOC_PURGE_DELAY", value);
    }
    let out = cmd.output().expect("run setpoint --version");
    assert!(out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    stderr
        .lines()
        .find_map(|l| l.strip_prefix("option 'purge_delay': "))
        .unwrap_or_else(|| panic!("no purge_delay in mimalloc's report:\n{stderr}"))
        .trim()
        .to_owned()
}

#[test]
fn freed_memory_is_kept_a_second_unless_the_environment_says_otherwise() {
    assert_eq!(reported_purge_delay(None), "1000");
    assert_eq!(reported_purge_delay(Some("50")), "50");
}
