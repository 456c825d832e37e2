//! The Container Runtime Interface, version 1 (`runtime.v1`): the messages and the gRPC
//! clients of its `RuntimeService` and `ImageService`, which kubelet speaks to containerd or
//! CRI-O.
//!
//! The code in `runtime_v1.rs` is generated from `proto/api.proto` (upstream's message and
//! field names and numbers) and committed, so building Setpoint needs no protobuf compiler.
//! Regenerate it after changing the proto file with
//! `cargo run -p setpoint-cri-proto --example regenerate`; a test fails while the two
//! disagree. Only clients are generated: Setpoint's node agent calls a runtime, it does not
//! serve CRI.

#![allow(missing_docs, clippy::all)]

/// The `runtime.v1` package.
pub mod runtime_v1 {
    include!("runtime_v1.rs");
}

pub use runtime_v1::*;

/// Registry credentials are secrets: the derived `Debug` is left out of the generated code
/// (as upstream marks these fields `debug_redact`) and this one shows only whether they are set.
impl std::fmt::Debug for runtime_v1::AuthConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        fn redacted(value: &str) -> &'static str {
            if value.is_empty() {
                ""
            } else {
                "[REDACTED]"
            }
        }
        f.debug_struct("AuthConfig")
            .field("username", &self.username)
            .field("password", &redacted(&self.password))
            .field("auth", &redacted(&self.auth))
            .field("server_address", &self.server_address)
            .field("identity_token", &redacted(&self.identity_token))
            .field("registry_token", &redacted(&self.registry_token))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auth_config_debug_hides_secrets() {
        let auth = AuthConfig {
            username: "user".into(),
            password: "hunter2".into(),
            auth: "dXNlcjpodW50ZXIy".into(),
            server_address: "registry.example".into(),
            identity_token: "idtok".into(),
            registry_token: String::new(),
        };
        let shown = format!("{auth:?}");
        assert!(shown.contains("user") && shown.contains("registry.example"));
        for secret in ["hunter2", "dXNlcjpodW50ZXIy", "idtok"] {
            assert!(!shown.contains(secret), "{shown}");
        }
    }
}
