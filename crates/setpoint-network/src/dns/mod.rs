//! The cluster DNS server: the model of CoreDNS's `kubernetes` plugin.
