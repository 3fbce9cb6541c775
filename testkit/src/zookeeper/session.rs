//! ZooKeeper sessions from outside their client: ending one over the wire as its own
//! client would (resuming it with the password the server derives from its id), and
//! the session that holds a lock.

use std::time::Duration;

use lock_core::LockName;
use lock_zookeeper::lock_dir;
use zookeeper_client as zk;

use super::{queue, BASE};

/// Ends ZooKeeper session `session_id` on the server at `addr` the way its own client
/// would close it: a second connection resumes the session with its id and password
/// (ZooKeeper derives the password from the id, see [`session_password`]) and sends
/// `closeSession` right behind the connect request (the session's own client, whose
/// connection the server closes when another resumes the session, would otherwise take it
/// back at once). The server deletes the session's ephemeral nodes at once; the session's
/// client is told it expired when it reconnects.
///
/// # Panics
/// When the session still resumes after a few tries, or the server does not answer
/// within 10 s.
pub async fn expire_session(addr: std::net::SocketAddr, session_id: i64) {
    use tokio::io::AsyncReadExt;
    /// The `closeSession` request type.
    const CLOSE_SESSION: i32 = -11;
    let close = async {
        for _ in 0..5 {
            let mut stream = resume_session(addr, session_id).await;
            // RequestHeader: xid, type.
            let mut request = 1i32.to_be_bytes().to_vec();
            request.extend_from_slice(&CLOSE_SESSION.to_be_bytes());
            send_frame(&mut stream, &request).await;
            // Whatever comes back, until the server closes the connection.
            let mut rest = Vec::new();
            let _ = stream.read_to_end(&mut rest).await;
            let mut check = resume_session(addr, session_id).await;
            if read_frame(&mut check)
                .await
                .is_some_and(|reply| resumed(&reply) == 0)
            {
                return;
            }
        }
        panic!("ZooKeeper session {session_id:#x} still resumes after closing it 5 times");
    };
    tokio::time::timeout(Duration::from_secs(10), close)
        .await
        .expect("ZooKeeper answers within 10 s");
}

/// A connection to `addr` that has sent the request resuming session `session_id`
/// (ConnectRequest: protocol version, last zxid seen, timeout in ms, session id, password,
/// read-only flag); its reply is left unread.
async fn resume_session(addr: std::net::SocketAddr, session_id: i64) -> tokio::net::TcpStream {
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let mut connect = Vec::new();
    connect.extend_from_slice(&0i32.to_be_bytes());
    connect.extend_from_slice(&0i64.to_be_bytes());
    connect.extend_from_slice(&10_000i32.to_be_bytes());
    connect.extend_from_slice(&session_id.to_be_bytes());
    connect.extend_from_slice(&16i32.to_be_bytes());
    connect.extend_from_slice(&session_password(session_id));
    connect.push(0);
    send_frame(&mut stream, &connect).await;
    stream
}

/// The session id of a ConnectResponse (protocol version, timeout, session id, ...): 0
/// when the session could not be resumed.
fn resumed(reply: &[u8]) -> i64 {
    reply
        .get(8..16)
        .and_then(|id| id.try_into().ok())
        .map_or(0, i64::from_be_bytes)
}

/// Sends one length-prefixed frame.
async fn send_frame(stream: &mut tokio::net::TcpStream, body: &[u8]) {
    use tokio::io::AsyncWriteExt;
    let len = i32::try_from(body.len()).expect("short frame");
    let mut frame = len.to_be_bytes().to_vec();
    frame.extend_from_slice(body);
    stream.write_all(&frame).await.expect("send");
}

/// Reads one length-prefixed frame; `None` when the connection ends first.
async fn read_frame(stream: &mut tokio::net::TcpStream) -> Option<Vec<u8>> {
    use tokio::io::AsyncReadExt;
    let len = stream.read_i32().await.ok()?;
    let mut body = vec![0; usize::try_from(len).ok()?];
    stream.read_exact(&mut body).await.ok()?;
    Some(body)
}

/// The password of ZooKeeper session `session_id`, as the server generates it:
/// `new java.util.Random(session_id ^ 0xB3415C00).nextBytes(new byte[16])`.
pub fn session_password(session_id: i64) -> [u8; 16] {
    const SUPER_SECRET: i64 = 0xB341_5C00;
    const MULTIPLIER: i64 = 0x5_DEEC_E66D;
    const MASK: i64 = (1 << 48) - 1;
    let mut seed = (session_id ^ SUPER_SECRET ^ MULTIPLIER) & MASK;
    let mut password = [0u8; 16];
    for chunk in password.chunks_mut(4) {
        seed = seed.wrapping_mul(MULTIPLIER).wrapping_add(0xB) & MASK;
        // `next(32)`: the top 32 of the 48 bits, least significant byte first.
        let word = (seed >> 16).to_le_bytes();
        chunk.copy_from_slice(&word[..chunk.len()]);
    }
    password
}

/// The session that owns the first lock node of `name` (its holder's), if any.
pub async fn holder_session(admin: &zk::Client, name: &LockName) -> Option<i64> {
    let first = queue(admin, name).await.into_iter().next()?;
    let path = format!("{}/{first}", lock_dir(BASE, name));
    let stat = admin.check_stat(&path).await.expect("stat");
    stat.map(|stat| stat.ephemeral_owner)
}
