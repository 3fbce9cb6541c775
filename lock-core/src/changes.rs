//! A feed of server-side changes to one name, for readers that follow it (an election's
//! observers): a push that says "read again", never the state itself.

use std::fmt;

use futures::stream::{BoxStream, StreamExt};

/// Fires when the server may have changed a name's holder, waiters or value. A push
/// hint only: it may fire for nothing and may miss a change across a reconnect, so its
/// readers re-read at least every `recheck` too.
pub struct ChangeFeed {
    stream: Option<BoxStream<'static, ()>>,
}

impl ChangeFeed {
    /// A feed that never fires: its readers only re-read every `recheck`.
    pub fn never() -> Self {
        ChangeFeed { stream: None }
    }

    /// A feed that fires on each item of `stream`; an ended stream stops firing.
    pub fn from_stream(stream: BoxStream<'static, ()>) -> Self {
        ChangeFeed {
            stream: Some(stream),
        }
    }

    /// Resolves at the next change; never, once the feed has ended (or never fired).
    pub async fn next(&mut self) {
        match &mut self.stream {
            Some(stream) => {
                if stream.next().await.is_none() {
                    self.stream = None;
                    std::future::pending::<()>().await;
                }
            }
            None => std::future::pending::<()>().await,
        }
    }

    /// Whether the feed can still fire.
    pub fn is_live(&self) -> bool {
        self.stream.is_some()
    }

    /// A feed that fires when either `self` or `other` does.
    pub fn merge(self, other: ChangeFeed) -> ChangeFeed {
        match (self.stream, other.stream) {
            (Some(a), Some(b)) => ChangeFeed::from_stream(futures::stream::select(a, b).boxed()),
            (Some(one), None) | (None, Some(one)) => ChangeFeed::from_stream(one),
            (None, None) => ChangeFeed::never(),
        }
    }
}

impl fmt::Debug for ChangeFeed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChangeFeed")
            .field("live", &self.is_live())
            .finish()
    }
}
