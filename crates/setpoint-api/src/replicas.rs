//! `spec.replicas` of the workloads that have one (Deployment, ReplicaSet, StatefulSet,
//! ReplicationController): absent means 1, as the API's defaulting writes it. Controllers
//! reading an object that was stored without defaulting (written straight into the store, or
//! by an older version) take the same answer.

/// The `spec.replicas` the API fills in when a workload leaves it out.
pub const DEFAULT: i32 = 1;

/// `spec.replicas` as Kubernetes reads it: the value, or [`DEFAULT`] when absent.
pub fn or_default(replicas: Option<i32>) -> i32 {
    replicas.unwrap_or(DEFAULT)
}

#[cfg(test)]
mod tests {
    #[test]
    fn absent_is_one() {
        assert_eq!(super::or_default(None), 1);
        assert_eq!(super::or_default(Some(0)), 0);
        assert_eq!(super::or_default(Some(5)), 5);
    }
}
