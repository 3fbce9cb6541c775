//! How a fenced resource's write (`fenced_store.lua`) is called, and what it replies.

use lock_core::fence::FenceOutcome;
use lock_core::{FencingToken, Result};

use super::{Call, Scripts};
use crate::error;

impl Scripts {
    /// `fenced_store.lua` on the resource hash `key`: stores `value` if `token` is at
    /// least the stored one.
    pub(crate) fn fenced_store<'s>(
        &'s self,
        key: &str,
        token: FencingToken,
        value: &[u8],
    ) -> Call<'s, (i64, String), FenceOutcome> {
        let mut invocation = self.fenced_store.prepare_invoke();
        invocation.key(key).arg(token.get()).arg(value);
        self.call("fenced write", invocation, |backend, (written, newest)| {
            Ok(match written {
                1 => FenceOutcome::Written,
                _ => FenceOutcome::Stale {
                    newest: token_of(backend, &newest)?,
                },
            })
        })
    }
}

/// A fencing token the server stored as decimal text.
pub(crate) fn token_of(backend: &'static str, text: &str) -> Result<FencingToken> {
    text.parse()
        .map(FencingToken)
        .map_err(|_| error::protocol(backend, format!("a fenced resource's token is {text:?}")))
}
