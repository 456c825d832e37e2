//! The node's heartbeat: a `coordination.k8s.io/v1` Lease `kube-node-lease/<node>` whose
//! `renewTime` the agent moves forward every renew interval (Kubernetes: 10 s, with a 40 s
//! lease duration). The node lifecycle controller reads it to tell a live node from a silent
//! one.
//!
//! The last written Lease is kept, so a renewal is one PUT (its resourceVersion the
//! precondition); after a conflict or an error the next renewal reads it again.

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference};
use setpoint_runtime::client::{Api, Client, ClientError, PostParams};

/// The namespace of node Leases.
pub const NAMESPACE: &str = "kube-node-lease";
/// `leaseDurationSeconds` of node Leases (Kubernetes' default).
pub const DURATION_SECONDS: i32 = 40;

/// Renews one node's Lease.
pub struct LeaseRenewer {
    api: Api<Lease>,
    node_name: String,
    owner: Option<OwnerReference>,
    last: Option<Lease>,
}

/// The renewed fields of `lease`, holder the node.
fn renewed(mut lease: Lease, node_name: &str, owner: Option<&OwnerReference>) -> Lease {
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    spec.holder_identity = Some(node_name.into());
    spec.lease_duration_seconds = Some(DURATION_SECONDS);
    spec.renew_time = Some(MicroTime(crate::status::wall_now()));
    if let Some(o) = owner {
        // The Node may have been deleted and registered again: only the current one owns it.
        let refs = lease.metadata.owner_references.get_or_insert_with(Vec::new);
        refs.retain(|r| r.kind != "Node" || r.uid == o.uid);
        if !refs.iter().any(|r| r.uid == o.uid) {
            refs.push(o.clone());
        }
    }
    lease
}

impl LeaseRenewer {
    /// A renewer for `node_name`'s Lease. `node_uid`, when known, makes the Node the Lease's
    /// owner, so deleting the Node deletes its Lease (as Kubernetes does).
    pub fn new(client: Client, node_name: &str, node_uid: Option<&str>) -> Self {
        let mut renewer = LeaseRenewer {
            api: Api::namespaced(client, NAMESPACE),
            node_name: node_name.into(),
            owner: None,
            last: None,
        };
        if let Some(uid) = node_uid {
            renewer.set_owner(uid);
        }
        renewer
    }

    /// Makes the Node with `uid` the Lease's owner from the next renewal on.
    pub fn set_owner(&mut self, uid: &str) {
        if let Some(o) = &mut self.owner {
            o.uid = uid.into();
        } else {
            self.owner = Some(OwnerReference {
                api_version: "v1".into(),
                kind: "Node".into(),
                name: self.node_name.clone(),
                uid: uid.into(),
                ..Default::default()
            });
        }
    }

    /// Moves `renewTime` to now, creating the Lease if it does not exist.
    pub async fn renew(&mut self) -> Result<(), ClientError> {
        match self.try_renew().await {
            Err(e) if e.is_conflict() || e.is_not_found() || e.is_already_exists() => {
                // Someone else wrote it (or deleted it): read afresh and try once more.
                self.try_renew().await
            }
            other => other,
        }
    }

    async fn try_renew(&mut self) -> Result<(), ClientError> {
        let params = PostParams {
            field_manager: Some(crate::podworker::FIELD_MANAGER.into()),
            ..Default::default()
        };
        let current = match self.last.take() {
            Some(l) => Some(l),
            None => self.api.get_opt(&self.node_name).await?,
        };
        let written = match current {
            Some(l) => {
                let l = renewed(l, &self.node_name, self.owner.as_ref());
                self.api.replace(&self.node_name, &params, &l).await?
            }
            None => {
                let l = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.node_name.clone()),
                        namespace: Some(NAMESPACE.into()),
                        ..Default::default()
                    },
                    spec: None,
                };
                let l = renewed(l, &self.node_name, self.owner.as_ref());
                self.api.create(&params, &l).await?
            }
        };
        self.last = Some(written);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(uid: &str) -> OwnerReference {
        OwnerReference {
            api_version: "v1".into(),
            kind: "Node".into(),
            name: "n".into(),
            uid: uid.into(),
            ..Default::default()
        }
    }

    #[test]
    fn renewal_names_the_holder_and_only_the_current_node_as_owner() {
        let l = renewed(Lease::default(), "n", Some(&owner("old")));
        let spec = l.spec.clone().unwrap();
        assert_eq!(spec.holder_identity.as_deref(), Some("n"));
        assert_eq!(spec.lease_duration_seconds, Some(DURATION_SECONDS));
        assert!(spec.renew_time.is_some());
        let again = renewed(l, "n", Some(&owner("new")));
        let refs = again.metadata.owner_references.unwrap();
        assert_eq!(refs.len(), 1);
        assert_eq!(refs[0].uid, "new");
    }

    #[test]
    fn a_lease_written_without_an_owner_gets_its_node_at_the_next_renewal() {
        // As a Lease written before nodes owned theirs, with another owner kept.
        let other = OwnerReference {
            api_version: "example.com/v1".into(),
            kind: "Keeper".into(),
            name: "k".into(),
            uid: "k-uid".into(),
            ..Default::default()
        };
        let mut old = Lease::default();
        old.metadata.owner_references = Some(vec![other.clone()]);
        let l = renewed(old, "n", Some(&owner("node-uid")));
        let refs = l.metadata.owner_references.unwrap();
        assert_eq!(refs, vec![other, owner("node-uid")]);
        assert_eq!(
            (
                refs[1].api_version.as_str(),
                refs[1].kind.as_str(),
                refs[1].name.as_str()
            ),
            ("v1", "Node", "n")
        );
        // Without a known uid (not registered yet) nothing is invented.
        let l = renewed(Lease::default(), "n", None);
        assert!(l.metadata.owner_references.is_none());
    }
}
