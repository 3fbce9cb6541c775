//! Plain SQL on a test server: its connection string and one simple query on a fresh
//! connection (the readiness probe's and the tests' way in).

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use tokio_postgres::{NoTls, SimpleQueryMessage};

/// The OS user the server runs as when the harness runs as root.
pub(crate) const OS_USER: &str = "postgres";

/// `host=127.0.0.1 port=PORT user=postgres dbname=postgres`, or through the Unix socket
/// in `socket`.
pub(crate) fn conninfo(port: u16, socket: Option<&Path>) -> String {
    let host = socket.map_or_else(|| "127.0.0.1".to_owned(), |dir| dir.display().to_string());
    format!("host={host} port={port} user={OS_USER} dbname=postgres")
}

/// One simple query on a fresh connection (over TCP, or the Unix socket in `socket`),
/// connect included within `timeout`.
pub(crate) async fn simple_query(
    addr: SocketAddr,
    socket: Option<&Path>,
    sql: &str,
    timeout: Duration,
) -> std::io::Result<Vec<Vec<Option<String>>>> {
    let work = async {
        let (client, connection) = tokio_postgres::connect(&conninfo(addr.port(), socket), NoTls)
            .await
            .map_err(std::io::Error::other)?;
        let messages = tokio::select! {
            messages = client.simple_query(sql) => messages.map_err(std::io::Error::other)?,
            closed = connection => {
                return Err(std::io::Error::other(format!("connection ended: {closed:?}")));
            }
        };
        Ok(messages
            .into_iter()
            .filter_map(|m| match m {
                SimpleQueryMessage::Row(row) => Some(
                    (0..row.len())
                        .map(|i| row.get(i).map(str::to_owned))
                        .collect(),
                ),
                _ => None,
            })
            .collect())
    };
    tokio::time::timeout(timeout, work)
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "query timed out"))?
}
