//! The service proxy: kube-proxy's job, in the model of its nftables mode.
