//! The suite's factory for dual deployments, `dual:<old url>|<new url>`: two backends'
//! factories side by side, each reached through its own URL, with the suite's hooks
//! (steal, crash, leftovers) on either side or both.
//!
//! [`DualFactory`] is generic over the two sides' factories ([`SideFactory`]: a
//! [`ChaosTarget`] that also says where its servers listen), so this crate keeps no
//! backend dependency: the test that builds a dual deployment brings the backends'
//! own factories. It is also a [`ChaosTarget`] whose faults (links, servers) hit the
//! sides chosen with [`DualFactory::faults`].

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use lock_core::migration::DUAL_TOKEN_PREFIX;
use lock_core::{DistributedLock, LockName, LockOptions, OwnerToken};

pub use crate::chaos::Sides;

use crate::chaos::{ChaosTarget, Link, ServerControl, Topology};
use conformance::factory::{connect_patiently, with_query, Crash, Factory};
use conformance::ServerLease;

/// One side of a dual deployment: a backend's factory that can also say where its servers
/// listen, so that a dual client can reach them through fault proxies.
#[async_trait]
pub trait SideFactory: ChaosTarget {
    /// The client address of every server, in the order of [`Factory::url`]'s host list.
    fn addrs(&self) -> Vec<SocketAddr>;

    /// What is left on this side's servers for `names` (as [`Factory::leftovers`]) when
    /// the clients were not made by this factory but by a dual URL. Defaults to
    /// [`Factory::leftovers`].
    async fn side_leftovers(&self, names: &[LockName]) -> Vec<String> {
        self.leftovers(names).await
    }
}

/// Dual clients of an old and a new deployment, for the conformance suite and the fault
/// scenarios.
///
/// By default [`Factory::steal`] removes the lock on the new side and the chaos faults
/// hit both sides; [`Factory::crashable_client`] always cuts both sides off.
pub struct DualFactory<O, N> {
    old: O,
    new: N,
    steal: Sides,
    faults: Sides,
    /// Proxies of crashable clients, kept alive as long as the factory.
    links: Mutex<Vec<Link>>,
}

impl<O, N> std::fmt::Debug for DualFactory<O, N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DualFactory")
            .field("steal", &self.steal)
            .field("faults", &self.faults)
            .finish_non_exhaustive()
    }
}

impl<O: SideFactory, N: SideFactory> DualFactory<O, N> {
    /// Dual clients of `old` and `new`.
    pub fn new(old: O, new: N) -> Self {
        DualFactory {
            old,
            new,
            steal: Sides::New,
            faults: Sides::Both,
            links: Mutex::new(Vec::new()),
        }
    }

    /// [`Factory::steal`] removes the lock on `sides`.
    pub fn steal_on(mut self, sides: Sides) -> Self {
        self.steal = sides;
        self
    }

    /// The chaos faults ([`ChaosTarget::linked_client`]'s link, [`ChaosTarget::servers`],
    /// and [`Factory::steal`], a key removed behind its holder's back) hit `sides`; the
    /// other side stays healthy. A later [`DualFactory::steal_on`] moves the steal.
    pub fn faults(mut self, sides: Sides) -> Self {
        self.faults = sides;
        self.steal = sides;
        self
    }

    /// The old side's factory.
    pub fn old(&self) -> &O {
        &self.old
    }

    /// The new side's factory.
    pub fn new_side(&self) -> &N {
        &self.new
    }

    /// The dual URL of the two sides' servers at `old` and `new` (proxies, or the servers
    /// themselves), with `options` in both sides' query strings.
    fn url_at(&self, old: &[SocketAddr], new: &[SocketAddr], options: &LockOptions) -> String {
        let query = options.to_query();
        format!(
            "dual:{}|{}",
            with_query(&with_hosts(&self.old.url(), old), &query),
            with_query(&with_hosts(&self.new.url(), new), &query)
        )
    }

    /// A dual client whose traffic to `proxied` sides passes fault proxies (one per
    /// server), and the link of those proxies.
    async fn client_through(
        &self,
        proxied: Sides,
        options: &LockOptions,
    ) -> (Arc<dyn DistributedLock>, Link) {
        let (old, new) = (self.old.addrs(), self.new.addrs());
        let mut faulted = Vec::new();
        if proxied.has_old() {
            faulted.extend_from_slice(&old);
        }
        if proxied.has_new() {
            faulted.extend_from_slice(&new);
        }
        let (link, mut addrs) = Link::proxied(&faulted).await;
        let new_addrs = if proxied.has_new() {
            addrs.split_off(addrs.len() - new.len())
        } else {
            new
        };
        let old_addrs = if proxied.has_old() { addrs } else { old };
        let url = self.url_at(&old_addrs, &new_addrs, options);
        let client = connect_patiently("dual client connects", || lock_core::connect(&url)).await;
        self.links.lock().expect("links").push(link.clone());
        (client, link)
    }
}

/// `url` (`scheme://[userinfo@]host,host/path`) with its hosts replaced by `addrs`, its
/// user info and path kept; `url` itself when there are none (an in-process backend).
///
/// # Panics
/// If `url` has no `://` (the factories' URLs all have).
pub fn with_hosts(url: &str, addrs: &[SocketAddr]) -> String {
    if addrs.is_empty() {
        return url.to_owned();
    }
    let (scheme, rest) = url.split_once("://").expect("a factory URL has a scheme");
    let (authority, path) = rest.split_at(rest.find(['/', '?']).unwrap_or(rest.len()));
    let userinfo = authority.rfind('@').map_or("", |at| &authority[..=at]);
    let hosts: Vec<String> = addrs.iter().map(ToString::to_string).collect();
    format!("{scheme}://{userinfo}{}{path}", hosts.join(","))
}

#[async_trait]
impl<O: SideFactory, N: SideFactory> Factory for DualFactory<O, N> {
    fn label(&self) -> String {
        format!("dual {} | {}", self.old.label(), self.new.label())
    }

    fn url(&self) -> String {
        format!("dual:{}|{}", self.old.url(), self.new.url())
    }

    fn short_ttl(&self) -> Duration {
        self.old.short_ttl().max(self.new.short_ttl())
    }

    async fn client(&self, options: LockOptions) -> Arc<dyn DistributedLock> {
        let url = self.url_at(&self.old.addrs(), &self.new.addrs(), &options);
        connect_patiently("dual client connects", || lock_core::connect(&url)).await
    }

    async fn crashable_client(
        &self,
        options: LockOptions,
    ) -> (Arc<dyn DistributedLock>, Box<dyn Crash>) {
        let (client, link) = self.client_through(Sides::Both, &options).await;
        (client, Box::new(link))
    }

    async fn steal(&self, name: &LockName) {
        if self.steal.has_new() {
            self.new.steal(name).await;
        }
        if self.steal.has_old() {
            self.old.steal(name).await;
        }
    }

    /// What both sides keep: the dual hold is each side's hold of the marked owner token,
    /// and lasts as long as the shorter of them.
    async fn server_lease(&self, name: &LockName, owner: &OwnerToken) -> ServerLease {
        let marked = OwnerToken::from_string(format!("{DUAL_TOKEN_PREFIX}{owner}"));
        let old = self.old.server_lease(name, &marked).await;
        let new = self.new.server_lease(name, &marked).await;
        match (old, new) {
            (ServerLease::Unknown, _) | (_, ServerLease::Unknown) => ServerLease::Unknown,
            (ServerLease::Absent, _) | (_, ServerLease::Absent) => ServerLease::Absent,
            (ServerLease::Left(old), ServerLease::Left(new)) => ServerLease::Left(old.min(new)),
        }
    }

    fn lease_resolution(&self) -> Duration {
        self.old.lease_resolution().max(self.new.lease_resolution())
    }

    async fn leftovers(&self, names: &[LockName]) -> Vec<String> {
        let old = self.old.side_leftovers(names).await;
        let new = self.new.side_leftovers(names).await;
        let old = old.into_iter().map(|left| format!("old side: {left}"));
        old.chain(new.into_iter().map(|left| format!("new side: {left}")))
            .collect()
    }
}

#[async_trait]
impl<O: SideFactory, N: SideFactory> ChaosTarget for DualFactory<O, N> {
    /// Both sides' topologies and the faulted sides: what the dual promises follows from
    /// them ([`expectation`](crate::chaos::expectation)).
    fn topology(&self) -> Topology {
        Topology::Dual {
            old: Box::new(self.old.topology()),
            new: Box::new(self.new.topology()),
            faults: self.faults,
        }
    }

    async fn linked_client(&self, options: LockOptions) -> (Arc<dyn DistributedLock>, Link) {
        self.client_through(self.faults, &options).await
    }

    fn servers(&self) -> Vec<&dyn ServerControl> {
        let mut servers = Vec::new();
        if self.faults.has_old() {
            servers.extend(self.old.servers());
        }
        if self.faults.has_new() {
            servers.extend(self.new.servers());
        }
        servers
    }

    async fn leader(&self) -> Option<usize> {
        match self.faults {
            Sides::New => self.new.leader().await,
            Sides::Old | Sides::Both => self.old.leader().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_are_replaced_and_the_user_info_and_path_kept() {
        let addrs: Vec<SocketAddr> = vec![
            "127.0.0.1:1".parse().expect("addr"),
            "127.0.0.1:2".parse().expect("addr"),
        ];
        let cases = [
            (
                "zk://127.0.0.1:9/conformance",
                "zk://127.0.0.1:1,127.0.0.1:2/conformance",
            ),
            ("redlock://a:1,b:2,c:3", "redlock://127.0.0.1:1,127.0.0.1:2"),
            (
                "redis://h:6379?ttl=1s",
                "redis://127.0.0.1:1,127.0.0.1:2?ttl=1s",
            ),
            (
                "postgres://postgres@h:5432/postgres?schema=t_1",
                "postgres://postgres@127.0.0.1:1,127.0.0.1:2/postgres?schema=t_1",
            ),
            (
                "redis://:s3cret@h:6379",
                "redis://:s3cret@127.0.0.1:1,127.0.0.1:2",
            ),
        ];
        for (url, expected) in cases {
            assert_eq!(with_hosts(url, &addrs), expected, "{url}");
        }
    }
}
