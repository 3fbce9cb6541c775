//! The chaos matrix: every deployment the fault scenarios run on, in report order, and
//! the primitives its capabilities grant besides the lock. A primitive's row (the
//! scenarios through [`Kinded`](super::Kinded)) exists only where the deployment grants
//! it; the reliability report says "not offered" for the rest. This module's test
//! checks every deployment against the capabilities its URL gives, without a server.

use lock_core::Capabilities;

use super::Primitive;

/// One deployment of the fault scenarios.
#[derive(Debug, Clone, Copy)]
pub struct Deployment {
    /// Its column in the reliability report.
    pub name: &'static str,
    /// A URL of its shape (the servers' addresses aside): its capabilities follow from it.
    pub url: &'static str,
    /// The primitives besides the lock that its capabilities grant.
    pub grants: &'static [Primitive],
    /// Whether its chaos suite runs the scenarios with each primitive it grants (else
    /// with the lock alone).
    pub primitives: bool,
}

impl Deployment {
    /// Whether the scenarios run on it with `primitive`.
    pub fn runs(&self, primitive: Primitive) -> bool {
        self.primitives && self.grants.contains(&primitive)
    }
}

const ALL: &[Primitive] = &Primitive::ALL;
/// RedLock: a semaphore or a read-write lock there needs more than a majority.
const ELECTION: &[Primitive] = &[Primitive::Election];

/// The single deployments, in report order (the dual ones run the lock alone).
pub const DEPLOYMENTS: &[Deployment] = &[
    row("memory", "memory://", ALL, true),
    row("redis", "redis://127.0.0.1:6379", ALL, true),
    row("redlock-5", REDLOCK_5, ELECTION, true),
    row("sentinel", SENTINEL_ACK_0, ALL, true),
    row("sentinel+wait", SENTINEL_ACK_1, ALL, false),
    row("cluster", "redis+cluster://127.0.0.1:7000", ALL, false),
    row("zookeeper", "zk://127.0.0.1:2181", ALL, true),
    row("zookeeper-tls", "zks://127.0.0.1:2281", ALL, false),
    row("zookeeper-3", ZK_3, ALL, true),
    row("etcd", "etcd://127.0.0.1:2379", ALL, true),
    row("etcd-3", ETCD_3, ALL, true),
    row("postgres", "postgres://127.0.0.1:5432", ALL, true),
];

const REDLOCK_5: &str =
    "redlock://127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003,127.0.0.1:7004,127.0.0.1:7005";
const SENTINEL_ACK_0: &str = "redis+sentinel://127.0.0.1:26379/distlock?wait_replicas=0";
const SENTINEL_ACK_1: &str = "redis+sentinel://127.0.0.1:26379/distlock?wait_replicas=1";
const ZK_3: &str = "zk://127.0.0.1:2181,127.0.0.1:2182,127.0.0.1:2183";
const ETCD_3: &str = "etcd://127.0.0.1:2379,127.0.0.1:2380,127.0.0.1:2381";

const fn row(
    name: &'static str,
    url: &'static str,
    grants: &'static [Primitive],
    primitives: bool,
) -> Deployment {
    Deployment {
        name,
        url,
        grants,
        primitives,
    }
}

/// The deployment called `name` in the report.
pub fn deployment(name: &str) -> Option<&'static Deployment> {
    DEPLOYMENTS.iter().find(|d| d.name == name)
}

/// Asserts that the matrix has the row of `primitive` on the deployment `name`: a chaos
/// suite calls it before anything starts, so that a row the deployment cannot run fails
/// in `make test` rather than in `make chaos`.
///
/// # Panics
/// When the deployment is unknown, does not grant `primitive`, or runs the lock alone.
pub fn assert_row(name: &str, primitive: Primitive) {
    let deployment = deployment(name).unwrap_or_else(|| {
        panic!("no chaos deployment is called {name:?} (lab::chaos::matrix::DEPLOYMENTS)")
    });
    assert!(
        deployment.runs(primitive),
        "the chaos matrix has no {} row on {name}: {}",
        primitive.label(),
        if deployment.grants.contains(&primitive) {
            "its suite runs the lock alone"
        } else {
            "its capabilities do not grant it"
        }
    );
}

impl Primitive {
    /// Every primitive, in report order.
    pub const ALL: [Primitive; 3] = [Primitive::Election, Primitive::Semaphore, Primitive::Writer];

    /// Whether a client with `capabilities` grants this primitive.
    pub fn granted_by(self, capabilities: &Capabilities) -> bool {
        match self {
            Primitive::Election => capabilities.election,
            Primitive::Semaphore => capabilities.semaphore,
            Primitive::Writer => capabilities.rwlock,
        }
    }
}

#[cfg(test)]
mod tests {
    use lock_core::raw::{driver::Connect, url::LockUrl};

    use super::*;

    /// What a client of `url` offers, from its configuration alone.
    fn capabilities(url: &str) -> Capabilities {
        let scheme = LockUrl::parse(url).expect("a URL").scheme;
        match scheme.as_str() {
            "memory" => lock_core::memory::CAPABILITIES,
            s if lock_zookeeper::SCHEMES.contains(&s) => lock_zookeeper::CAPABILITIES,
            s if lock_etcd::SCHEMES.contains(&s) => lock_etcd::CAPABILITIES,
            s if lock_postgres::SCHEMES.contains(&s) => lock_postgres::CAPABILITIES,
            s if lock_redis::SCHEMES.contains(&s) => lock_redis::RedisBackend::config_from_str(url)
                .expect("a Redis configuration")
                .capabilities(),
            other => panic!("no backend serves {other}://"),
        }
    }

    /// The whole matrix against the capabilities: a deployment lists exactly the
    /// primitives it grants, so no row offers what the backend refuses.
    #[test]
    fn every_row_is_granted_by_its_deployment() {
        for deployment in DEPLOYMENTS {
            let capabilities = capabilities(deployment.url);
            let granted: Vec<Primitive> = Primitive::ALL
                .into_iter()
                .filter(|p| p.granted_by(&capabilities))
                .collect();
            assert_eq!(
                deployment.grants, granted,
                "{} ({}) grants {granted:?}",
                deployment.name, deployment.url
            );
            for primitive in Primitive::ALL {
                if deployment.runs(primitive) {
                    assert_row(deployment.name, primitive);
                }
            }
        }
    }

    #[test]
    fn redlock_runs_elections_only() {
        let redlock = deployment("redlock-5").expect("RedLock");
        assert!(redlock.runs(Primitive::Election));
        assert!(!redlock.runs(Primitive::Semaphore));
        assert!(!redlock.runs(Primitive::Writer));
    }
}
