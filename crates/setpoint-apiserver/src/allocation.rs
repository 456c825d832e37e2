//! What the server allocates to objects beyond their own key, reserved in the store so that
//! two objects never share it: today a Service's cluster IP (from 10.96.0.0/12, the
//! `kubernetes` service keeping 10.96.0.1), as upstream's service REST storage allocates it.
//!
//! The generic write path asks [`ApiServer::allocate_for`] before it stores a new object,
//! [`ApiServer::release`] when that store fails, and [`ApiServer::release_held`] once an
//! object is gone; which kinds allocate what is decided here alone.

use bytes::Bytes;
use serde_json::{json, Value};
use setpoint_api::{meta, ApiError, Cause};
use setpoint_store::{Precondition, StoreError};

use crate::registry::ResourceDef;
use crate::state::ApiServer;

/// Where allocated service cluster IPs are reserved, so two services never share one.
const SERVICE_IP_PREFIX: &str = "/registry/_allocations/serviceips/";

/// What a new object was given, to be released if its create does not happen.
#[derive(Debug)]
pub(crate) enum Reservation {
    /// A Service's cluster IP.
    ClusterIp(String),
}

impl ApiServer {
    /// Allocates what a new object of `res` needs (a Service's cluster IP), writing it into
    /// the object. `None` when the kind or the object needs nothing.
    pub(crate) async fn allocate_for(
        &self,
        res: &ResourceDef,
        obj: &mut Value,
    ) -> Result<Option<Reservation>, ApiError> {
        if is_service(res) {
            return Ok(self
                .allocate_cluster_ip(obj)
                .await?
                .map(Reservation::ClusterIp));
        }
        Ok(None)
    }

    /// Gives back what [`Self::allocate_for`] reserved for an object that was not stored.
    pub(crate) async fn release(&self, reservation: &Reservation) {
        match reservation {
            Reservation::ClusterIp(ip) => self.release_cluster_ip(ip).await,
        }
    }

    /// Gives back what a removed object held (a Service's cluster IP).
    pub(crate) async fn release_held(&self, res: &ResourceDef, obj: &Value) {
        if is_service(res) {
            if let Some(ip) = obj.pointer("/spec/clusterIP").and_then(Value::as_str) {
                if !ip.is_empty() && ip != "None" {
                    self.release_cluster_ip(ip).await;
                }
            }
        }
    }

    /// Reserves a cluster IP for a new Service that needs one (type other than ExternalName,
    /// `clusterIP` unset). Returns the reserved address.
    async fn allocate_cluster_ip(&self, svc: &mut Value) -> Result<Option<String>, ApiError> {
        let ty = svc
            .pointer("/spec/type")
            .and_then(Value::as_str)
            .unwrap_or("ClusterIP");
        if ty == "ExternalName" {
            return Ok(None);
        }
        let requested = svc
            .pointer("/spec/clusterIP")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        if requested == "None" {
            return Ok(None);
        }
        let candidates: Vec<String> = if !requested.is_empty() {
            vec![requested.clone()]
        } else {
            // 10.96.0.0/12 minus the network address and 10.96.0.1 (the `kubernetes` service).
            let start: u32 = rand::random::<u32>() % ((1 << 20) - 3);
            (0..64)
                .map(|i| ip_in_range((start + i * 7919) % ((1 << 20) - 3) + 2))
                .collect()
        };
        for ip in candidates {
            let key = format!("{SERVICE_IP_PREFIX}{ip}");
            match self
                .store
                .put(&key, Bytes::from_static(b"{}"), Precondition::NotExists)
                .await
            {
                Ok(_) => {
                    if let Some(spec) = svc.get_mut("spec").and_then(Value::as_object_mut) {
                        spec.insert("clusterIP".into(), json!(ip));
                        spec.insert("clusterIPs".into(), json!([ip]));
                    }
                    return Ok(Some(ip));
                }
                Err(StoreError::AlreadyExists { .. }) => {
                    if !requested.is_empty() {
                        return Err(ApiError::invalid(
                            "",
                            "Service",
                            meta::name(svc),
                            vec![Cause::invalid(
                                "spec.clusterIPs",
                                &json!([requested]),
                                &format!("failed to allocate IP {requested}: provided IP is already allocated"),
                            )],
                        ));
                    }
                }
                Err(e) => return Err(ApiError::internal(e.to_string())),
            }
        }
        Err(ApiError::internal(
            "failed to allocate a service cluster IP: range is full",
        ))
    }

    async fn release_cluster_ip(&self, ip: &str) {
        let _ = self
            .store
            .delete(&format!("{SERVICE_IP_PREFIX}{ip}"), Precondition::None)
            .await;
    }
}

fn is_service(res: &ResourceDef) -> bool {
    res.group.is_empty() && res.plural == "services"
}

/// The `n`th address of 10.96.0.0/12.
fn ip_in_range(n: u32) -> String {
    let base: u32 = (10 << 24) | (96 << 16);
    let ip = base + n;
    format!(
        "{}.{}.{}.{}",
        ip >> 24,
        (ip >> 16) & 255,
        (ip >> 8) & 255,
        ip & 255
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_ips_stay_in_range() {
        assert_eq!(ip_in_range(1), "10.96.0.1");
        assert_eq!(ip_in_range((1 << 20) - 1), "10.111.255.255");
    }
}
