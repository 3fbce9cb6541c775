//! The Lua scripts of the protocol (in `scripts/`), in the flavour a topology needs: one
//! server, Sentinel and RedLock publish wake-ups with `PUBLISH`, Redis Cluster with `SPUBLISH`.

use redis::Script;

/// The Lua scripts (sent as EVALSHA, loaded again on `NOSCRIPT`). Shared helpers are
/// prepended: `tokens.lua` to the scripts that grant (acquires, the queue's release),
/// `queue.lua` to the queue scripts, the inspection and the force release, `broken.lua`
/// to renewal, release and proclaim, `leader.lua` (elections) to the scripts that grant,
/// release or break, `shared.lua` (permits, readers and writers) to their scripts and the
/// force release; and to every script that may wake waiters or tell an election's
/// observers, the command it publishes with (`PUBLISH`). The queue's acquire and release
/// start with their uncontended paths (`fast_acquire.lua`, `fast_release.lua`), which
/// return before the helpers they do not need are defined: the server pays for each
/// helper defined on every call.
pub(crate) struct Scripts {
    pub(crate) acquire: Script,
    pub(crate) release: Script,
    pub(crate) acquire_q: Script,
    pub(crate) release_q: Script,
    pub(crate) renew: Script,
    pub(crate) fence_write: Script,
    pub(crate) inspect: Script,
    pub(crate) force_release: Script,
    pub(crate) proclaim: Script,
    /// Shared kinds (permits, readers, writers): acquire, release and downgrade.
    pub(crate) acquire_s: Script,
    pub(crate) release_s: Script,
    pub(crate) downgrade: Script,
}

impl Scripts {
    /// The scripts for one server or RedLock, or for Redis Cluster (`cluster`): there every
    /// wake-up is published on the shard of its name (`SPUBLISH`, to a channel in the
    /// name's hash slot), and renewal covers the holds of many slots in one call
    /// (`allow-cross-slot-keys`).
    pub(crate) fn new(cluster: bool) -> Self {
        let publish = if cluster {
            "local PUBLISH = 'SPUBLISH'\n"
        } else {
            "local PUBLISH = 'PUBLISH'\n"
        };
        let script = |parts: &[&str]| Script::new(&parts.concat());
        let tokens = include_str!("scripts/tokens.lua");
        let queue = include_str!("scripts/queue.lua");
        let broken = include_str!("scripts/broken.lua");
        let leader = include_str!("scripts/leader.lua");
        let shared = include_str!("scripts/shared.lua");
        let shared_script = |body: &str| script(&[publish, tokens, queue, broken, shared, body]);
        Scripts {
            acquire: script(&[publish, tokens, leader, include_str!("scripts/acquire.lua")]),
            release: script(&[publish, broken, leader, include_str!("scripts/release.lua")]),
            acquire_q: script(&[
                publish,
                tokens,
                include_str!("scripts/fast_acquire.lua"),
                queue,
                leader,
                include_str!("scripts/acquire_q.lua"),
            ]),
            release_q: script(&[
                publish,
                include_str!("scripts/fast_release.lua"),
                tokens,
                leader,
                queue,
                broken,
                include_str!("scripts/release_q.lua"),
            ]),
            renew: script(&[
                if cluster {
                    "#!lua flags=allow-cross-slot-keys\n"
                } else {
                    ""
                },
                broken,
                include_str!("scripts/renew.lua"),
            ]),
            fence_write: script(&[publish, include_str!("scripts/fence_write.lua")]),
            inspect: script(&[publish, queue, include_str!("scripts/inspect.lua")]),
            force_release: script(&[
                publish,
                tokens,
                queue,
                broken,
                leader,
                shared,
                include_str!("scripts/break.lua"),
            ]),
            proclaim: script(&[publish, broken, include_str!("scripts/proclaim.lua")]),
            acquire_s: shared_script(include_str!("scripts/acquire_s.lua")),
            release_s: shared_script(include_str!("scripts/release_s.lua")),
            downgrade: shared_script(include_str!("scripts/downgrade.lua")),
        }
    }
}
