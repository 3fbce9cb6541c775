//! lockctl never prints a password, and passes it on intact: a Redis that requires a
//! password with a `#` in it serves `lockctl run --ttl` (which rewrites the URL's query),
//! and the messages of failed runs (a closed port, a bad option) show no secret.

use std::net::SocketAddr;

use harness::{or_skip, RedisServer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The password; `#` is where a URL fragment would start.
const PASSWORD: &str = "s3cr#t-pw";

/// `lockctl --url URL run --ttl 3s NAME -- true`: exit code and stderr.
async fn run(url: &str) -> (Option<i32>, String) {
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_lockctl"))
        .args([
            "--url",
            url,
            "run",
            "-w",
            "5",
            "--ttl",
            "3s",
            "secret-check",
        ])
        .args(["--", "true"])
        .output()
        .await
        .expect("lockctl runs");
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_with_a_hash_works_and_never_prints() {
    let Some(server) = or_skip(RedisServer::start().await) else {
        return;
    };
    require_password(server.addr()).await;
    let url = format!("redis://:{PASSWORD}@{}?request_timeout=1s", server.addr());
    let (code, stderr) = run(&url).await;
    assert_eq!(code, Some(0), "lockctl run with the password: {stderr}");

    let closed = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let closed = closed.local_addr().expect("addr");
    let failing = [
        format!("redis://:{PASSWORD}@{closed}?request_timeout=300ms"),
        format!("redis://:{PASSWORD}@{}?recheck=banana", server.addr()),
        format!("redis+sentinel://{closed}/p?sentinel_password={PASSWORD}&request_timeout=300ms"),
        format!("etcd://u:{PASSWORD}@{closed}/locks?request_timeout=300ms"),
        format!("dual:zk://u:{PASSWORD}@{closed}/l|redis://:{PASSWORD}@{closed}"),
    ];
    for url in failing {
        let (code, stderr) = run(&url).await;
        assert_ne!(code, Some(0), "{url} cannot work");
        assert!(
            !stderr.contains(PASSWORD) && !stderr.contains("s3cr"),
            "lockctl printed the password: {stderr}"
        );
    }
}

/// Makes the Redis server at `addr` require [`PASSWORD`] (`CONFIG SET requirepass`).
async fn require_password(addr: SocketAddr) {
    let mut stream = TcpStream::connect(addr).await.expect("connect to Redis");
    let args = ["CONFIG", "SET", "requirepass", PASSWORD];
    let mut request = format!("*{}\r\n", args.len());
    for arg in args {
        request.push_str(&format!("${}\r\n{arg}\r\n", arg.len()));
    }
    stream
        .write_all(request.as_bytes())
        .await
        .expect("send CONFIG SET");
    let mut reply = [0; 5];
    stream.read_exact(&mut reply).await.expect("read the reply");
    assert_eq!(&reply, b"+OK\r\n", "CONFIG SET requirepass");
}
