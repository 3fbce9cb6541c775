//! A fenced resource on etcd ([`EtcdFence`]): the value and its newest token in two keys,
//! compared and written in one transaction.

use std::fmt;

use async_trait::async_trait;
use etcd_client::{Compare, CompareOp, Txn, TxnOp, TxnOpResponse, TxnResponse};
use lock_core::fence::{FenceOutcome, Fenced, FencedStore};
use lock_core::raw::url::LockUrl;
use lock_core::{Error, FencingToken, Result};

use crate::config::EtcdConfig;
use crate::connection::{first_kv, EtcdClient};
use crate::error::unexpected;

/// What follows a resource's key in the name of its token key.
pub const TOKEN_SUFFIX: &str = "/fencing-token";

/// A fenced resource on etcd: the value at `key`, the newest accepted fencing token at
/// `key` + [`TOKEN_SUFFIX`] (20 decimal digits, zero-padded, so that etcd's byte-wise
/// comparison of values is the numeric one).
///
/// A write is one transaction: if the token key is absent, or its value is not greater
/// than this token, put both keys; else read the token key. etcd applies it atomically
/// through Raft, so the token is as durable as the value (a majority's log). The keys are
/// used as given, not under the lock URL's prefix.
///
/// Built from the same configuration or URL as a lock client (`etcd://`, `etcds://`, with
/// credentials and TLS); every call is bounded by the request timeout and fails over
/// between members as the lock client's calls do.
#[derive(Clone)]
pub struct EtcdFence {
    client: EtcdClient,
    key: String,
    token_key: String,
}

impl fmt::Debug for EtcdFence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdFence")
            .field("client", &self.client)
            .field("key", &self.key)
            .finish()
    }
}

impl EtcdFence {
    /// The fenced resource at `key` on the members `url` names (a lock URL), once one
    /// answers.
    ///
    /// # Errors
    /// As [`EtcdFence::open`], and [`Error::InvalidConfig`] for a malformed URL.
    pub async fn connect(url: &str, key: &str) -> Result<Self> {
        Self::open(&EtcdConfig::from_url(&LockUrl::parse(url)?)?, key).await
    }

    /// The fenced resource at `key` on the members of `config` (a lock client's own),
    /// once one answers.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for an invalid configuration or an empty key; the
    /// connection's error when no member answers within the request timeout.
    pub async fn open(config: &EtcdConfig, key: &str) -> Result<Self> {
        config.validate()?;
        check_key(key)?;
        let client = EtcdClient::connect(config).await?;
        Ok(Self::on(client, key))
    }

    fn on(client: EtcdClient, key: &str) -> Self {
        EtcdFence {
            client,
            key: key.to_owned(),
            token_key: format!("{key}{TOKEN_SUFFIX}"),
        }
    }

    /// Another resource, `key`, on the same connection.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for an empty key.
    pub fn resource(&self, key: &str) -> Result<Self> {
        check_key(key)?;
        Ok(Self::on(self.client.clone(), key))
    }

    /// The resource's key.
    pub fn key(&self) -> &str {
        &self.key
    }
}

fn check_key(key: &str) -> Result<()> {
    if key.is_empty() {
        return Err(Error::config(
            "a fenced resource needs a non-empty etcd key",
        ));
    }
    Ok(())
}

/// A token as the token key holds it: 20 digits, zero-padded.
fn stored(token: FencingToken) -> String {
    format!("{:020}", token.get())
}

/// A token read back from the token key.
fn token_of(value: &[u8]) -> Result<FencingToken> {
    std::str::from_utf8(value)
        .ok()
        .and_then(|text| text.parse().ok())
        .map(FencingToken)
        .ok_or_else(|| unexpected("fenced write", "a fencing token key that is not a number"))
}

/// The newest token in a refused write's answer: the inner transaction's read.
fn refused_by(response: &TxnResponse) -> Result<Option<FencingToken>> {
    let Some(TxnOpResponse::Txn(inner)) = response.op_responses().into_iter().next() else {
        return Err(unexpected(
            "fenced write",
            "no inner transaction in the answer",
        ));
    };
    if !inner.succeeded() {
        return Ok(None);
    }
    let newest = inner
        .op_responses()
        .first()
        .and_then(first_kv)
        .map(|kv| token_of(kv.value()))
        .ok_or_else(|| unexpected("fenced write", "the token key vanished mid-transaction"))?;
    newest.map(Some)
}

#[async_trait]
impl FencedStore for EtcdFence {
    async fn write(&self, token: FencingToken, value: &[u8]) -> Result<FenceOutcome> {
        let puts = [
            TxnOp::put(self.key.as_bytes(), value, None),
            TxnOp::put(self.token_key.as_bytes(), stored(token), None),
        ];
        let existing = Txn::new()
            .when([Compare::value(
                self.token_key.as_bytes(),
                CompareOp::Greater,
                stored(token),
            )])
            .and_then([TxnOp::get(self.token_key.as_bytes(), None)])
            .or_else(puts.clone());
        let txn = Txn::new()
            .when([Compare::create_revision(
                self.token_key.as_bytes(),
                CompareOp::Equal,
                0,
            )])
            .and_then(puts)
            .or_else([TxnOp::txn(existing)]);
        let response = self.client.txn("fenced write", txn).await?;
        if response.succeeded() {
            return Ok(FenceOutcome::Written);
        }
        Ok(match refused_by(&response)? {
            Some(newest) => FenceOutcome::Stale { newest },
            None => FenceOutcome::Written,
        })
    }

    async fn read(&self) -> Result<Option<Fenced>> {
        // One transaction: the token and the value of one revision.
        let txn = Txn::new().and_then([
            TxnOp::get(self.token_key.as_bytes(), None),
            TxnOp::get(self.key.as_bytes(), None),
        ]);
        let response = self.client.txn("fenced read", txn).await?;
        let ops = response.op_responses();
        let Some(token) = ops.first().and_then(first_kv) else {
            return Ok(None);
        };
        Ok(Some(Fenced {
            token: token_of(token.value())?,
            value: ops
                .get(1)
                .and_then(first_kv)
                .map(|kv| kv.value().to_vec())
                .unwrap_or_default(),
        }))
    }
}
