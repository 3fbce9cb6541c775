//! Putting an acquisition's key in the queue: one transaction puts it (or finds a
//! leftover of ours and starts over), deletes its twin and reads the entries ahead that
//! tell whether it is granted at once.

use etcd_client::{Compare, CompareOp, KeyValue, PutOptions, Txn, TxnOp};
use lock_core::Result;

use super::{Enqueued, Place, Queue};
use crate::connection::{first_kv, header_revision};
use crate::error::unexpected;
use crate::layout::{queue_head, queue_tail, reads_all_ahead, twin_key};

impl Queue {
    /// Puts our key in the queue of `place` (or finds it there), with `value` (see
    /// [`crate::layout`]), deletes its [`twin_key`] (a leftover), and reads what is
    /// ahead of it in the same transaction (see [`Enqueued::ahead`]). One round trip.
    pub(crate) async fn enqueue(
        &self,
        place: &Place<'_>,
        lease: i64,
        value: &[u8],
    ) -> Result<Enqueued> {
        const WHAT: &str = "acquire";
        let (prefix, key) = (place.prefix, place.key);
        // A key of ours from an earlier, abandoned attempt is deleted and the put
        // retried, so every acquisition gets a fresh create revision (fencing token).
        for _ in 0..3 {
            // An exclusive kind is granted when nobody is ahead: the entries just before
            // ours tell that, and where its wait starts.
            let read = if reads_all_ahead(place.kind) {
                queue_head(place.kind)
            } else {
                queue_tail()
            };
            let put = TxnOp::put(key, value, Some(PutOptions::new().with_lease(lease)));
            let twin = TxnOp::delete(twin_key(key), None);
            let ops = [put, twin, TxnOp::get(prefix, Some(read))];
            let txn = Txn::new()
                .when([Compare::create_revision(key, CompareOp::Equal, 0)])
                .and_then(ops)
                .or_else([TxnOp::get(key, None)]);
            let response = self.client.txn(WHAT, txn).await?;
            let ops = response.op_responses();
            if response.succeeded() {
                let revision = header_revision(&response, WHAT)?;
                let before = |range: &etcd_client::GetResponse| -> Vec<KeyValue> {
                    range
                        .kvs()
                        .iter()
                        .filter(|kv| kv.create_revision() < revision)
                        .cloned()
                        .collect()
                };
                let ahead = match ops.get(2) {
                    Some(etcd_client::TxnOpResponse::Get(range)) => before(range),
                    _ => return Err(unexpected(WHAT, "an answer without the queue's head")),
                };
                let nearest = (!reads_all_ahead(place.kind)).then(|| ahead.clone());
                return Ok(Enqueued {
                    revision,
                    ahead,
                    nearest,
                });
            }
            let Some(stale) = ops
                .first()
                .and_then(first_kv)
                .map(KeyValue::create_revision)
            else {
                continue;
            };
            tracing::debug!(key, stale, "removing a leftover key of this client");
            self.client.delete_if_ours(key, Some(stale)).await?;
        }
        Err(unexpected(WHAT, "our queue key kept reappearing"))
    }
}
