//! Undoing what a cancelled or failed request may have left on a server: a guard that,
//! unless disarmed, runs the cleanup in a background task when dropped. Dropping never
//! blocks; outside a runtime the cleanup is skipped and the server-side expiry (TTL,
//! session, lease) ends what was left.

use std::fmt;
use std::future::Future;

use super::Background;

/// What to undo on the server, and how.
pub trait Cleanup: Send + 'static {
    /// Undoes it. Runs in a background task; reports its own failures (the server-side
    /// expiry ends whatever it could not remove).
    fn cleanup(self) -> impl Future<Output = ()> + Send;

    /// Whether there is anything to undo (default: always).
    fn is_needed(&self) -> bool {
        true
    }
}

/// Runs [`Cleanup::cleanup`] of its state in a background task when dropped, unless
/// [`CleanupOnDrop::disarm`] took the state first.
pub struct CleanupOnDrop<C: Cleanup> {
    state: Option<C>,
    /// Where the cleanup runs, so that closing the client waits for it; `None`: a task of
    /// its own on the current runtime.
    background: Option<Background>,
}

impl<C: Cleanup> CleanupOnDrop<C> {
    /// Arms the guard with `state`.
    pub fn new(state: C) -> Self {
        CleanupOnDrop {
            state: Some(state),
            background: None,
        }
    }

    /// Runs the cleanup, if any, among the client's `background` work (which closing the
    /// client waits for).
    pub fn tracked_by(mut self, background: &Background) -> Self {
        self.background = Some(background.clone());
        self
    }

    /// The state, to record what a request in flight may leave behind.
    pub fn state_mut(&mut self) -> &mut C {
        self.state
            .as_mut()
            .unwrap_or_else(|| unreachable!("the state is taken only by disarm and drop"))
    }

    /// Nothing is left to undo: returns the state without cleaning up.
    pub fn disarm(mut self) -> C {
        self.state
            .take()
            .unwrap_or_else(|| unreachable!("the state is taken only by disarm and drop"))
    }
}

impl<C: Cleanup> Drop for CleanupOnDrop<C> {
    fn drop(&mut self) {
        let Some(state) = self.state.take() else {
            return;
        };
        if !state.is_needed() {
            return;
        }
        if let Some(background) = &self.background {
            background.spawn(state.cleanup());
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(state.cleanup());
            }
            Err(_) => tracing::warn!(
                "an abandoned request was dropped outside a runtime; the server-side expiry ends what it left"
            ),
        }
    }
}

impl<C: Cleanup + fmt::Debug> fmt::Debug for CleanupOnDrop<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CleanupOnDrop")
            .field("state", &self.state)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::mpsc;

    struct Undo(mpsc::UnboundedSender<&'static str>, bool);

    impl Cleanup for Undo {
        async fn cleanup(self) {
            let _ = self.0.send("cleaned");
        }

        fn is_needed(&self) -> bool {
            self.1
        }
    }

    #[tokio::test]
    async fn dropped_guard_cleans_up_and_disarmed_or_unneeded_one_does_not() {
        let (sender, mut receiver) = mpsc::unbounded_channel();
        drop(CleanupOnDrop::new(Undo(sender.clone(), true)));
        assert_eq!(receiver.recv().await, Some("cleaned"));

        let guard = CleanupOnDrop::new(Undo(sender.clone(), true));
        drop(guard.disarm());
        let mut unneeded = CleanupOnDrop::new(Undo(sender, true));
        unneeded.state_mut().1 = false;
        drop(unneeded);
        // Every sender is gone; no cleanup sent anything.
        assert_eq!(receiver.recv().await, None);
    }
}
