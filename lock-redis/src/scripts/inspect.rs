//! How an operator's scripts are called: the inspection of a name (`inspect.lua`,
//! changing nothing), the force release (`break.lua`) and a semaphore's resize
//! (`resize.lua`), and what they reply.

use std::time::Duration;

use redis::ScriptInvocation;

use lock_core::raw::backend::SemaphoreResize;

use super::{ttl_millis, Call, Scripts};
use crate::layout::{self, KeyLayout, BROKEN_KEPT};

/// What one server shows of a name (`inspect.lua`): the lock key's value and PTTL, the
/// fencing counter, the live waiter ids in ticket order, the leader entry, the holders of
/// a shared kind (owner token, `<kind>:<fencing token>`, ms left; flattened, oldest grant
/// first) and the kind of each waiter listed ("" where unknown).
pub(crate) type View = (
    Option<String>,
    i64,
    Option<u64>,
    Vec<String>,
    LeaderView,
    Vec<String>,
    Vec<String>,
);

/// What one server shows of a name's leader entry (see `leader.lua`): owner token, term,
/// value, version, since when (server time in ms); each `None` where absent.
pub(crate) type LeaderView = (
    Option<String>,
    Option<u64>,
    Option<Vec<u8>>,
    Option<u64>,
    Option<u64>,
);

/// What `break.lua` returns: the owner token removed, its PTTL, a candidate's term and
/// value, a shared kind's `<kind>:<fencing token>`.
pub(crate) type Removed = (
    Option<String>,
    i64,
    Option<u64>,
    Option<Vec<u8>>,
    Option<String>,
);

impl Scripts {
    /// `inspect.lua` for lock key `key` under `layout`.
    pub(crate) fn inspect(&self, layout: &KeyLayout, key: &str) -> Call<'_, View> {
        let mut invocation = queue_keys(&self.inspect, layout, key);
        invocation
            .key(layout.side_key(key, layout::LEADER))
            .key(layout.side_key(key, layout::HOLDERS));
        self.plain("inspect", invocation)
    }

    /// `break.lua` for lock key `key` under `layout`: deletes it whoever holds it (`only`
    /// that owner token, when given), adds the owner token removed to the break mark (kept
    /// at least `stay`) and wakes the waiters as a release does (`channel` precedes a
    /// queued waiter's client id, a woken head has `window` to take the lock).
    pub(crate) fn force_release(
        &self,
        layout: &KeyLayout,
        key: &str,
        stay: Duration,
        channel: &str,
        window: Duration,
        only: Option<&str>,
    ) -> Call<'_, Removed> {
        let mut invocation = queue_keys(&self.force_release, layout, key);
        invocation
            .key(layout.side_key(key, layout::BROKEN))
            .key(layout.side_key(key, layout::LEADER))
            .key(layout.side_key(key, layout::HOLDERS))
            .arg(ttl_millis(stay))
            .arg(BROKEN_KEPT)
            .arg(channel)
            .arg(ttl_millis(window))
            .arg(layout.side_key(key, layout::RELEASED))
            .arg(layout.side_key(key, layout::CHANGED))
            .arg(only.unwrap_or(""));
        self.plain("force release", invocation)
    }
}

impl Scripts {
    /// `resize.lua`: every hold and waiter of the semaphore whose lock key is `key` gets
    /// `resize.to` permits (the reservation's hold all of them), then the waiters that fit
    /// are granted. Replies `{1}`, `{-1, permits or kind code}` or `{-2, count}`.
    pub(crate) fn resize(
        &self,
        layout: &KeyLayout,
        key: &str,
        resize: &SemaphoreResize<'_>,
        channel: &str,
    ) -> Call<'_, Vec<i64>> {
        let mut invocation = queue_keys(&self.resize, layout, key);
        invocation
            .key(layout.side_key(key, layout::HOLDERS))
            .arg(resize.from)
            .arg(resize.to)
            .arg(resize.reservation.map_or("", |token| token.as_str()))
            .arg(channel)
            .arg(layout.side_key(key, layout::CHANGED));
        self.plain("resize", invocation)
    }
}

/// `script` with the keys of `queue.lua` for lock key `key` (lock, fencing counter,
/// queue, liveness), whether or not the client queues.
fn queue_keys<'s>(
    script: &'s redis::Script,
    layout: &KeyLayout,
    key: &str,
) -> ScriptInvocation<'s> {
    let mut invocation = script.prepare_invoke();
    invocation.key(key);
    for suffix in [layout::FENCE, layout::QUEUE, layout::QUEUE_LIVE] {
        invocation.key(layout.side_key(key, suffix));
    }
    invocation
}
