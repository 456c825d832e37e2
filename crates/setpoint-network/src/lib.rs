//! Node networking for Setpoint, the parts a node runs beside its pods (what kube-proxy and
//! CoreDNS do on a Kubernetes cluster):
//!
//! - [`proxy`]: the service proxy. It watches Services and EndpointSlices and programs the
//!   node so that a Service's virtual addresses reach its ready endpoints.
//! - [`dns`]: the cluster DNS server, answering for `<service>.<namespace>.svc.<domain>`
//!   from the same informers and forwarding every other name to the host's resolvers.
//! - [`routes`]: host-gw routing, a route to every other node's pod range through its
//!   address, so pods on several machines reach each other.
//! - [`masquerade`]: the node's one NAT rule, masquerading pod traffic that leaves the
//!   cluster CIDR (traffic between pods keeps the pods' addresses).
//!
//! Both are level-triggered: they compute the whole desired state from their caches and
//! apply the difference, so a restart resynchronises without a separate recovery path.

pub mod dns;
pub mod masquerade;
pub mod proxy;
pub mod routes;
