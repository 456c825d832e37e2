//! The `default/kubernetes` Service's endpoints: the API servers themselves, after
//! upstream's lease endpoint reconciler.
//!
//! Every API server records itself under [`LEASE_PREFIX`] (`<ip>:<port>`, with an expiry
//! [`LEASE_TTL`] ahead) every [`RECONCILE_INTERVAL`], drops the records that expired, and
//! writes the Endpoints `default/kubernetes` and the EndpointSlice `default/kubernetes` to
//! list exactly the servers whose records are live. Several servers on one etcd therefore
//! list each other, and a server that stops is gone from the endpoints one TTL later. The
//! Endpoints carry `endpointslice.kubernetes.io/skip-mirror: true`, as upstream's do, since
//! the slice is written here too.
//!
//! The Service itself is created at bootstrap; when the server listens on a port chosen at
//! bind time, it is created here once the port is known.

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use serde_json::{json, Value};
use setpoint_api::ApiError;
use setpoint_store::{Precondition, RangeRequest};

use crate::objects::WriteOptions;
use crate::state::ApiServer;
use crate::strategy::View;

/// Where each API server's record lives (upstream's `/masterleases/`).
pub const LEASE_PREFIX: &str = "/registry/_masterleases/";
/// How long a record stays live without renewal (upstream's `--endpoint-reconciler` lease
/// TTL).
pub const LEASE_TTL: Duration = Duration::from_secs(15);
/// How often a server renews its record and rewrites the endpoints.
pub const RECONCILE_INTERVAL: Duration = Duration::from_secs(10);
/// The Service, its Endpoints and its EndpointSlice.
const NAME: &str = "kubernetes";
const NAMESPACE: &str = "default";
/// The `kubernetes` Service's cluster IP.
const KUBERNETES_IP: &str = "10.96.0.1";
/// The Service's port name.
const PORT_NAME: &str = "https";

/// One API server's record.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Lease {
    /// The address clients reach it at.
    pub ip: IpAddr,
    /// Its port.
    pub port: u16,
    /// When the record expires, in seconds since the epoch.
    pub expires: u64,
}

impl Lease {
    /// The store key of the record.
    pub fn key(&self) -> String {
        format!("{LEASE_PREFIX}{}", SocketAddr::new(self.ip, self.port))
    }

    fn encode(&self) -> Bytes {
        Bytes::from(
            json!({"ip": self.ip.to_string(), "port": self.port, "expires": self.expires})
                .to_string(),
        )
    }

    fn decode(bytes: &[u8]) -> Option<Lease> {
        let v: Value = serde_json::from_slice(bytes).ok()?;
        Some(Lease {
            ip: v.get("ip")?.as_str()?.parse().ok()?,
            port: u16::try_from(v.get("port")?.as_u64()?).ok()?,
            expires: v.get("expires")?.as_u64()?,
        })
    }
}

/// The live servers among the records at `now` (seconds since the epoch), in order.
pub fn live(leases: &[Lease], now: u64) -> Vec<SocketAddr> {
    let mut out: Vec<SocketAddr> = leases
        .iter()
        .filter(|l| l.expires > now)
        .map(|l| SocketAddr::new(l.ip, l.port))
        .collect();
    out.sort();
    out.dedup();
    out
}

fn port(number: u16) -> Value {
    json!({"name": PORT_NAME, "port": number, "protocol": "TCP"})
}

/// The Endpoints listing `servers`: one subset per port, addresses in order.
pub fn endpoints(servers: &[SocketAddr]) -> Value {
    let mut ports: Vec<u16> = servers.iter().map(SocketAddr::port).collect();
    ports.sort();
    ports.dedup();
    let subsets: Vec<Value> = ports
        .iter()
        .map(|p| {
            let addresses: Vec<Value> = servers
                .iter()
                .filter(|s| s.port() == *p)
                .map(|s| json!({"ip": s.ip().to_string()}))
                .collect();
            json!({"addresses": addresses, "ports": [port(*p)]})
        })
        .collect();
    json!({
        "apiVersion": "v1", "kind": "Endpoints",
        "metadata": {"name": NAME, "namespace": NAMESPACE,
                     "labels": {"endpointslice.kubernetes.io/skip-mirror": "true"}},
        "subsets": subsets,
    })
}

/// The EndpointSlice listing `servers` of the address family of `own` on its port (servers
/// on other ports are in the Endpoints' other subsets; a slice has one set of ports).
pub fn endpoint_slice(servers: &[SocketAddr], own: SocketAddr) -> Value {
    let family = |a: &SocketAddr| a.is_ipv4();
    let endpoints: Vec<Value> = servers
        .iter()
        .filter(|s| s.port() == own.port() && family(s) == family(&own))
        .map(|s| json!({"addresses": [s.ip().to_string()], "conditions": {"ready": true}}))
        .collect();
    json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": NAME, "namespace": NAMESPACE,
                     "labels": {"kubernetes.io/service-name": NAME}},
        "addressType": if own.is_ipv4() { "IPv4" } else { "IPv6" },
        "endpoints": endpoints,
        "ports": [port(own.port())],
    })
}

/// Whether the stored object already says what `want` says in the fields this module owns.
fn same(stored: &Value, want: &Value, fields: &[&str]) -> bool {
    let labels_ok = want["metadata"]["labels"]
        .as_object()
        .into_iter()
        .flatten()
        .all(|(k, v)| stored["metadata"]["labels"].get(k) == Some(v));
    labels_ok && fields.iter().all(|f| stored.get(*f) == want.get(*f))
}

/// The address other machines reach a server listening on `listen` at: the listen address
/// itself, or for an unspecified one the address of the interface with the default route
/// (found by connecting a UDP socket, which sends nothing), else loopback.
pub fn advertised(listen: SocketAddr) -> IpAddr {
    if !listen.ip().is_unspecified() {
        return listen.ip();
    }
    let probe = || -> std::io::Result<IpAddr> {
        let s = std::net::UdpSocket::bind("0.0.0.0:0")?;
        s.connect("192.0.2.1:9")?;
        Ok(s.local_addr()?.ip())
    };
    probe()
        .ok()
        .filter(|ip| !ip.is_unspecified())
        .unwrap_or(IpAddr::from([127, 0, 0, 1]))
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default()
}

impl ApiServer {
    /// The address this server, listening on `bound`, is reached at by pods and other
    /// machines: `--advertise-address` when given, else [`advertised`] of `bound`.
    pub fn advertise_address(&self, bound: SocketAddr) -> IpAddr {
        self.config
            .advertise_address
            .filter(|ip| !ip.is_unspecified())
            .unwrap_or_else(|| advertised(bound))
    }

    /// Keeps this server's record and the `kubernetes` endpoints current until the server
    /// stops; `bound` is the address it listens on.
    pub(crate) async fn master_endpoints_loop(self: std::sync::Arc<Self>, bound: SocketAddr) {
        let own = SocketAddr::new(self.advertise_address(bound), bound.port());
        let mut stop = self.stopping.subscribe();
        loop {
            if let Err(e) = self.reconcile_master_endpoints(own).await {
                tracing::warn!(error = %e.message, "reconciling the kubernetes service's endpoints");
            }
            tokio::select! {
                _ = tokio::time::sleep(RECONCILE_INTERVAL) => {}
                _ = stop.wait_for(|s| *s) => return,
            }
        }
    }

    /// One pass: renew this server's record, drop expired ones, write the endpoints.
    async fn reconcile_master_endpoints(&self, own: SocketAddr) -> Result<(), ApiError> {
        let store_err = |e: setpoint_store::StoreError| ApiError::internal(e.to_string());
        let now = now_secs();
        let mine = Lease {
            ip: own.ip(),
            port: own.port(),
            expires: now + LEASE_TTL.as_secs(),
        };
        self.store
            .put(&mine.key(), mine.encode(), Precondition::None)
            .await
            .map_err(store_err)?;
        let listed = self
            .store
            .range(RangeRequest {
                prefix: LEASE_PREFIX.to_string(),
                ..Default::default()
            })
            .await
            .map_err(store_err)?;
        let mut leases = Vec::new();
        for kv in &listed.kvs {
            match Lease::decode(&kv.value) {
                Some(l) if l.expires > now => leases.push(l),
                // Expired (or unreadable): removed unless renewed meanwhile.
                _ => {
                    let _ = self
                        .store
                        .delete(&kv.key, Precondition::ModRevision(kv.mod_revision))
                        .await;
                }
            }
        }
        let servers = live(&leases, now);
        self.ensure_kubernetes_service(own.port()).await?;
        self.write_owned("", "endpoints", endpoints(&servers), &["subsets"])
            .await?;
        self.write_owned(
            "discovery.k8s.io",
            "endpointslices",
            endpoint_slice(&servers, own),
            &["addressType", "endpoints", "ports"],
        )
        .await
    }

    /// Creates the `kubernetes` Service if it is missing (bootstrap could not when the port
    /// was chosen at bind time).
    async fn ensure_kubernetes_service(&self, port: u16) -> Result<(), ApiError> {
        let res = self
            .registry()
            .get("", "v1", "services")
            .expect("built in")
            .clone();
        match self.get_object(&res, NAMESPACE, NAME).await {
            Ok(_) => return Ok(()),
            Err(e) if e.code == 404 => {}
            Err(e) => return Err(e),
        }
        // The allocator never hands out 10.96.0.1: a reservation of it without the Service
        // is left from an earlier start (whose bootstrap reserved it before a create that
        // failed), and would refuse this create.
        self.release(&crate::allocation::Reservation::cluster_ip(KUBERNETES_IP))
            .await;
        match self
            .create(
                &res,
                NAMESPACE,
                crate::server::kubernetes_service(port),
                &WriteOptions::default(),
            )
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if e.reason == "AlreadyExists" => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Creates `want`, or updates the stored object when `fields` or its labels differ.
    async fn write_owned(
        &self,
        group: &str,
        plural: &str,
        want: Value,
        fields: &[&str],
    ) -> Result<(), ApiError> {
        let res = self
            .registry()
            .get(group, "v1", plural)
            .expect("built in")
            .clone();
        match self.get_object(&res, NAMESPACE, NAME).await {
            Ok(stored) if same(&stored, &want, fields) => Ok(()),
            Ok(mut stored) => {
                for f in fields {
                    stored[*f] = want[*f].clone();
                }
                let labels = stored["metadata"]
                    .as_object_mut()
                    .map(|m| m.entry("labels").or_insert_with(|| json!({})));
                if let (Some(Value::Object(have)), Some(add)) =
                    (labels, want["metadata"]["labels"].as_object())
                {
                    have.extend(add.clone());
                }
                // The read's resourceVersion makes this a compare-and-swap: a server that
                // loses the race writes again on its next pass.
                match self
                    .update(
                        &res,
                        NAMESPACE,
                        NAME,
                        View::Main,
                        stored,
                        &WriteOptions::default(),
                    )
                    .await
                {
                    Ok(_) => Ok(()),
                    Err(e) if e.code == 409 => Ok(()),
                    Err(e) => Err(e),
                }
            }
            Err(e) if e.code == 404 => {
                match self
                    .create(&res, NAMESPACE, want, &WriteOptions::default())
                    .await
                {
                    Ok(_) => Ok(()),
                    Err(e) if e.reason == "AlreadyExists" => Ok(()),
                    Err(e) => Err(e),
                }
            }
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(ip: &str, port: u16, expires: u64) -> Lease {
        Lease {
            ip: ip.parse().unwrap(),
            port,
            expires,
        }
    }

    #[test]
    fn only_unexpired_records_are_listed() {
        let leases = [
            lease("10.0.0.2", 6443, 100),
            lease("10.0.0.1", 6443, 120),
            lease("10.0.0.3", 6443, 99),
        ];
        let servers = live(&leases, 99);
        assert_eq!(
            servers,
            vec![
                "10.0.0.1:6443".parse().unwrap(),
                "10.0.0.2:6443".parse().unwrap()
            ]
        );
        assert!(live(&leases, 120).is_empty());
        let l = lease("10.0.0.1", 6443, 5);
        assert_eq!(Lease::decode(&l.encode()), Some(l.clone()));
        assert_eq!(l.key(), "/registry/_masterleases/10.0.0.1:6443");
    }

    #[test]
    fn endpoints_list_every_live_server_and_the_slice_those_on_its_port() {
        let servers: Vec<SocketAddr> = vec![
            "10.0.0.1:6443".parse().unwrap(),
            "10.0.0.2:6443".parse().unwrap(),
            "127.0.0.1:7000".parse().unwrap(),
        ];
        let ep = endpoints(&servers);
        assert_eq!(
            ep["subsets"],
            json!([
                {"addresses": [{"ip": "10.0.0.1"}, {"ip": "10.0.0.2"}],
                 "ports": [{"name": "https", "port": 6443, "protocol": "TCP"}]},
                {"addresses": [{"ip": "127.0.0.1"}],
                 "ports": [{"name": "https", "port": 7000, "protocol": "TCP"}]},
            ])
        );
        assert_eq!(
            ep["metadata"]["labels"]["endpointslice.kubernetes.io/skip-mirror"],
            "true"
        );
        let slice = endpoint_slice(&servers, servers[0]);
        assert_eq!(slice["addressType"], "IPv4");
        assert_eq!(
            slice["endpoints"],
            json!([
                {"addresses": ["10.0.0.1"], "conditions": {"ready": true}},
                {"addresses": ["10.0.0.2"], "conditions": {"ready": true}},
            ])
        );
        assert_eq!(
            slice["metadata"]["labels"]["kubernetes.io/service-name"],
            "kubernetes"
        );
        assert!(same(&slice, &slice, &["endpoints", "ports"]));
        let mut other = slice.clone();
        other["endpoints"] = json!([]);
        assert!(!same(&other, &slice, &["endpoints"]));
    }

    #[test]
    fn a_specific_listen_address_is_advertised_as_is() {
        let listen: SocketAddr = "127.0.0.1:6443".parse().unwrap();
        assert_eq!(advertised(listen), listen.ip());
        assert!(!advertised("0.0.0.0:6443".parse().unwrap()).is_unspecified());
    }
}
