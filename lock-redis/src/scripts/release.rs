//! How the owner-checked writes of a hold are called: its release (`release.lua`, the
//! queue's `release_q.lua`, the shared kinds' `release_s.lua`), a writer's downgrade or
//! an upgradeable reader's upgrade (`rekind.lua`) and a candidate's proclaim
//! (`proclaim.lua`). Each replies with a status: 1 done, 0 gone, -1 held by another
//! owner, -2 broken (and 2 for an upgrade still waiting for readers).

use std::time::Duration;

use super::{queue_invocation, ttl_millis, Call, Scripts};
use crate::layout::{CandidateKeys, HoldKeys, SharedKeys};

impl Scripts {
    /// `release.lua`: compare-and-DEL of the lock key of `keys` on `token`, then a
    /// publish on `channel`, the name's wake-up channel ("" for none); a candidate's entry
    /// goes with it.
    pub(crate) fn release(&self, keys: &HoldKeys, token: &str, channel: &str) -> Call<'_, i64> {
        let mut invocation = self.release.prepare_invoke();
        invocation
            .key(&keys.key)
            .arg(token)
            .arg(channel)
            .arg(keys.leader_arg())
            .arg(keys.changed_arg());
        self.pass_break_mark(&mut invocation, &keys.broken);
        self.plain("release", invocation)
    }

    /// `release_q.lua`: the queue's release, which wakes (or grants) the head of the
    /// queue on its client's channel (`channel` precedes the client id), a woken head
    /// having `window` to take the lock; with `leave`, the acquisition's waiter also
    /// leaves the queue.
    pub(crate) fn release_q(
        &self,
        keys: &HoldKeys,
        token: &str,
        leave: bool,
        channel: &str,
        window: Duration,
    ) -> Call<'_, i64> {
        let mut invocation = queue_invocation(&self.release_q, keys, token);
        invocation
            .arg(if leave { keys.waiter() } else { "" })
            .arg(channel)
            .arg(ttl_millis(window))
            .arg(keys.leader_arg())
            .arg(keys.changed_arg());
        self.pass_break_mark(&mut invocation, &keys.broken);
        self.plain("release", invocation)
    }

    /// `release_s.lua`: removes a hold of a shared kind from the holders, with `leave`
    /// takes its waiter out of the queue, and grants the waiters the holders then admit.
    pub(crate) fn release_s(
        &self,
        keys: &HoldKeys,
        token: &str,
        shared: &SharedKeys,
        leave: bool,
        channel: &str,
    ) -> Call<'_, i64> {
        let mut invocation = shared_invocation(&self.release_s, keys, token, shared);
        invocation
            .arg(if leave { keys.waiter() } else { "" })
            .arg(channel)
            .arg(&shared.changed);
        self.plain("release", invocation)
    }

    /// `rekind.lua`: a read-write hold's entry in the holders' table becomes `to`'s
    /// (`R`: a writer's downgrade, whose queued readers are granted; `W`: an upgradeable
    /// reader's upgrade step, 2 while readers still hold beside it).
    pub(crate) fn rekind(
        &self,
        keys: &HoldKeys,
        token: &str,
        shared: &SharedKeys,
        channel: &str,
        to: &str,
    ) -> Call<'_, i64> {
        let mut invocation = shared_invocation(&self.rekind, keys, token, shared);
        invocation.arg(channel).arg(&shared.changed).arg(to);
        self.plain("rekind", invocation)
    }

    /// `proclaim.lua`: where the lock of `keys` is `token`'s, `value` goes into the
    /// candidate's leader entry as `version` and is published on the election's change
    /// channel; an entry gone comes back with the hold's term.
    pub(crate) fn proclaim(
        &self,
        keys: &HoldKeys,
        token: &str,
        candidate: &CandidateKeys,
        value: &[u8],
        version: u64,
    ) -> Call<'_, i64> {
        let mut invocation = self.proclaim.prepare_invoke();
        invocation
            .key(&keys.key)
            .arg(token)
            .arg(&candidate.leader)
            .arg(value)
            .arg(version)
            .arg(&candidate.changed)
            .arg(candidate.term.get().map_or(String::new(), u64::to_string));
        self.pass_break_mark(&mut invocation, &keys.broken);
        self.plain("proclaim", invocation)
    }
}

/// `script` of the shared kinds for the hold of `keys` (see `shared.lua`): lock, fencing
/// counter, queue, liveness, holders' table, break mark; its owner `token` first.
fn shared_invocation<'s>(
    script: &'s redis::Script,
    keys: &HoldKeys,
    token: &str,
    shared: &SharedKeys,
) -> redis::ScriptInvocation<'s> {
    let mut invocation = queue_invocation(script, keys, token);
    invocation.key(&shared.table).key(&keys.broken);
    invocation
}
