//! How a dual lock merges its two sides' answers into one: renewal outcomes and session
//! statuses.

use tokio::sync::watch;

use crate::backend::{RenewOutcome, SessionHealth, SessionStatus};
use crate::state::{LostReason, Side};

/// The next change of `session`; `None` without a session or once it is gone.
pub(super) async fn session_change(
    session: &mut Option<watch::Receiver<SessionStatus>>,
) -> Option<()> {
    session.as_mut()?.changed().await.ok()
}

/// One renewal outcome from the two sides' outcomes.
pub(super) fn combine_renewals((old, new): (RenewOutcome, RenewOutcome)) -> RenewOutcome {
    match (old, new) {
        (RenewOutcome::Lost(reason), _) => {
            RenewOutcome::Lost(LostReason::on_side(Side::Old, reason))
        }
        (_, RenewOutcome::Lost(reason)) => {
            RenewOutcome::Lost(LostReason::on_side(Side::New, reason))
        }
        (RenewOutcome::Renewed { lease: old }, RenewOutcome::Renewed { lease: new }) => {
            RenewOutcome::Renewed {
                lease: old.min(new),
            }
        }
        _ => RenewOutcome::Undecided,
    }
}

/// One session status from both sides': its epoch is the sum of theirs (a hold records
/// the sum of its sides' epochs, so every hold of an expired side's epoch is at or below
/// it), its health the worse.
pub(super) fn merge_sessions(
    mut old: watch::Receiver<SessionStatus>,
    mut new: watch::Receiver<SessionStatus>,
) -> watch::Receiver<SessionStatus> {
    let merged = |old: SessionStatus, new: SessionStatus| SessionStatus {
        epoch: old.epoch + new.epoch,
        health: [old.health, new.health]
            .into_iter()
            .max_by_key(|health| match health {
                SessionHealth::Connected => 0,
                SessionHealth::Suspended => 1,
                SessionHealth::Expired => 2,
            })
            .unwrap_or(SessionHealth::Connected),
    };
    let (sender, receiver) = watch::channel(merged(*old.borrow(), *new.borrow()));
    tokio::spawn(async move {
        loop {
            tokio::select! {
                changed = old.changed() => if changed.is_err() { return },
                changed = new.changed() => if changed.is_err() { return },
                () = sender.closed() => return,
            }
            let status = merged(*old.borrow_and_update(), *new.borrow_and_update());
            sender.send_replace(status);
        }
    });
    receiver
}
