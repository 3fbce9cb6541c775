//! How the renewal script (`renew.lua`) is called: compare-and-PEXPIRE of many holds in
//! one call, a status for each (see `hold::status`).

use std::time::Duration;

use super::{ttl_millis, Call, Scripts};
use crate::layout::HoldKeys;

/// One hold a renewal covers: its keys, the owner token in its lock key and the TTL it
/// gets.
#[derive(Clone, Copy)]
pub(crate) struct Renewal<'a> {
    pub(crate) keys: &'a HoldKeys,
    pub(crate) token: &'a str,
    pub(crate) ttl: Duration,
}

impl Scripts {
    /// `renew.lua` for `holds`: the lock key and break mark of each, then the owner token,
    /// TTL and third argument of each (see [`HoldKeys::renew_arg`]). On Redis Cluster the
    /// keys go as arguments (the script allows cross-slot keys); `routed_by`, declared as
    /// a key as well, routes (and redirects) the call by it.
    pub(crate) fn renew<'h>(
        &self,
        holds: impl IntoIterator<Item = Renewal<'h>> + Clone,
        routed_by: Option<&str>,
    ) -> Call<'_, Vec<i64>> {
        let mut invocation = self.renew.prepare_invoke();
        for hold in holds.clone() {
            if self.cluster {
                invocation.arg(&hold.keys.key).arg(&hold.keys.broken);
            } else {
                invocation.key(&hold.keys.key).key(&hold.keys.broken);
            }
        }
        for hold in holds {
            invocation
                .arg(hold.token)
                .arg(ttl_millis(hold.ttl))
                .arg(hold.keys.renew_arg());
        }
        if let Some(key) = routed_by {
            invocation.key(key);
        }
        self.plain("renew", invocation)
    }
}
