//! Setpoint's node agent (the kubelet's role): registers `Node` objects, renews their Leases,
//! and runs the pods bound to them through a [`runtime::PodRuntime`] — local processes
//! ([`process`]) or simulated containers ([`simulated`]).

pub mod runtime;
