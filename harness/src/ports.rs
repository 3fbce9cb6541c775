//! Free loopback ports for test servers.
//!
//! Ports are drawn at random from below the kernel's ephemeral range, so that a client
//! reconnecting to a restarting server can never be handed the server's own port as its
//! local port (a self-connect), and so that concurrently running test processes rarely
//! pick the same port. Each candidate is checked by binding it; within one process a port
//! is never handed out twice. Across processes a race remains between the check and the
//! server's own bind: server start-up detects "address already in use" and retries on
//! fresh ports.

use std::collections::HashSet;
use std::net::{Ipv4Addr, TcpListener};
use std::sync::{LazyLock, Mutex, PoisonError};

use rand::Rng;

use super::HarnessError;

/// Lowest port the harness hands out when it picks from below the ephemeral range.
const LOW: u16 = 10_000;
/// Candidates tried before giving up.
const MAX_CANDIDATES: usize = 2_000;

static HANDED_OUT: LazyLock<Mutex<HashSet<u16>>> = LazyLock::new(|| Mutex::new(HashSet::new()));

/// One free TCP port on 127.0.0.1, never handed out before by this process.
///
/// # Errors
/// [`HarnessError::Io`] if no free port could be found.
pub fn free_port() -> Result<u16, HarnessError> {
    free_ports(1)?.pop().ok_or_else(|| {
        HarnessError::io(
            "ports",
            "pick a free port",
            std::io::Error::other("no port"),
        )
    })
}

/// `n` distinct free TCP ports on 127.0.0.1, never handed out before by this process.
///
/// # Errors
/// [`HarnessError::Io`] if not enough free ports could be found.
pub fn free_ports(n: usize) -> Result<Vec<u16>, HarnessError> {
    let high = ephemeral_low();
    let mut taken = HANDED_OUT.lock().unwrap_or_else(PoisonError::into_inner);
    let mut out = Vec::with_capacity(n);
    let mut rng = rand::rng();
    for _ in 0..MAX_CANDIDATES {
        if out.len() == n {
            break;
        }
        let candidate = if high > LOW + 1_000 {
            rng.random_range(LOW..high)
        } else {
            // Unusual ephemeral range: let the kernel pick.
            match bind_check(0) {
                Some(p) => p,
                None => continue,
            }
        };
        if taken.contains(&candidate) || out.contains(&candidate) {
            continue;
        }
        if bind_check(candidate).is_some() {
            out.push(candidate);
        }
    }
    if out.len() < n {
        return Err(HarnessError::io(
            "ports",
            format!("pick {n} free ports"),
            std::io::Error::new(
                std::io::ErrorKind::AddrInUse,
                format!("only {} found", out.len()),
            ),
        ));
    }
    taken.extend(out.iter().copied());
    Ok(out)
}

/// Binds `port` (0: any) on 127.0.0.1 and releases it; returns the bound port on success.
fn bind_check(port: u16) -> Option<u16> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, port)).ok()?;
    listener.local_addr().ok().map(|a| a.port())
}

/// The first port of the kernel's ephemeral range (32768 if unknown).
fn ephemeral_low() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768)
}
