//! A server's wall clock that the harness moves while the server runs ([`FakeClock`]), for
//! the clock-jump fault scenarios: an NTP step or an operator's `date -s` on the server's
//! machine.
//!
//! The server is started with a library preloaded (`LD_PRELOAD`) that adds an offset to
//! every wall-clock reading (`clock_gettime` of the real-time clocks, `gettimeofday`,
//! `time`); the offset comes from a file of the server's own (`FAKETIME_TIMESTAMP_FILE`),
//! read again while the server runs, so rewriting the file moves the running server's
//! clock ([`ClockHook::lag`] later at most). The monotonic clocks are left alone
//! (`FAKETIME_DONT_FAKE_MONOTONIC=1`): a real clock step never moves them either. The
//! file holds libfaketime's relative offset, in seconds: `+600.000s`, `-3600.000s`.
//!
//! Which library depends on the kind ([`ClockHook`]):
//! - Debian's libfaketime for the JVM that runs ZooKeeper, with the file read again at
//!   most once a second (`FAKETIME_CACHE_DURATION=1`, counted in whole seconds: a step
//!   lands within 2 s): without a cache
//!   (`FAKETIME_NO_CACHE=1`) libfaketime opens and parses the file at every clock reading,
//!   clock_gettime of the monotonic clock included, which made a JVM's
//!   `System.currentTimeMillis` cost about 116 µs instead of 0.1 µs, and ZooKeeper then
//!   failed to start or to keep its sessions on a loaded machine.
//! - A small library of the harness's own ([`ClockHook::Own`], the same environment and
//!   file format, compiled with `cc` on first use) for redis-server: libfaketime cannot run
//!   Debian's redis-server, which is linked with jemalloc; jemalloc reads the clock while
//!   libfaketime initialises, and the server never starts ("Unexpected recursive calls to
//!   clock_gettime()", libfaketime's known clash with jemalloc). It reads the file again
//!   once 10 ms have passed.
//! - None for etcd: a Go program reads the clock through the kernel's vDSO without the C
//!   library, so no preloaded library reaches it (under libfaketime with a day's offset,
//!   etcd still logs the machine's date).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::Duration;

use super::process::find_binary;
use super::{write_file, HarnessError};

/// Where the harness looks for libfaketime (`$FAKETIME_LIB` first).
const FAKE_CLOCK_LIBS: [&str; 4] = [
    "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/faketime/libfaketime.so.1",
    "/usr/local/lib/faketime/libfaketime.so.1",
];
const LIBFAKETIME_HINT: &str = "make deps (installs libfaketime)";
const CC_HINT: &str = "make deps (installs gcc and libc6-dev)";

/// The harness's own wall-clock library, for kinds libfaketime cannot run (see the module
/// docs): the wall clock plus the offset in `$FAKETIME_TIMESTAMP_FILE`, read again once
/// 10 ms have passed; the machine's clock comes from the C library's `clock_gettime`
/// (found with `dlsym` on first use, the system call until then and for any reading made
/// while it is being found, so that an allocator reading the clock never recurses), and
/// no reading allocates.
const SHIM_SOURCE: &str = r#"
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

typedef int (*clock_fn)(clockid_t, struct timespec *);
static clock_fn real_clock;
static int resolving;
static int64_t offset, offset_read_at;

/* The C library's clock_gettime (the vDSO), found on first use; the system call
   meanwhile, and for whatever asks for the time while it is being found (jemalloc does,
   from the allocation dlsym makes). */
static int machine_clock(clockid_t id, struct timespec *ts) {
    clock_fn real = __atomic_load_n(&real_clock, __ATOMIC_ACQUIRE);
    if (real != NULL) return real(id, ts);
    if (!__atomic_exchange_n(&resolving, 1, __ATOMIC_ACQ_REL)) {
        real = (clock_fn)dlsym(RTLD_NEXT, "clock_gettime");
        __atomic_store_n(&real_clock, real, __ATOMIC_RELEASE);
        if (real != NULL) return real(id, ts);
    }
    return (int)syscall(SYS_clock_gettime, id, ts);
}

/* The offset in ns from the file, read again once 10 ms have passed since the last
   read; the last offset read when the file cannot be read whole. */
static int64_t offset_ns(void) {
    struct timespec mono;
    if (machine_clock(CLOCK_MONOTONIC, &mono) != 0) return __atomic_load_n(&offset, __ATOMIC_RELAXED);
    int64_t now = (int64_t)mono.tv_sec * 1000000000 + mono.tv_nsec;
    int64_t last = __atomic_load_n(&offset_read_at, __ATOMIC_RELAXED);
    if (last != 0 && now - last < 10000000) return __atomic_load_n(&offset, __ATOMIC_RELAXED);
    __atomic_store_n(&offset_read_at, now, __ATOMIC_RELAXED);
    const char *path = getenv("FAKETIME_TIMESTAMP_FILE");
    char text[64];
    if (path == NULL) return 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return __atomic_load_n(&offset, __ATOMIC_RELAXED);
    ssize_t n = read(fd, text, sizeof text - 1);
    close(fd);
    if (n <= 0) return __atomic_load_n(&offset, __ATOMIC_RELAXED);
    text[n] = 0;
    const char *p = text;
    int64_t sign = 1, seconds = 0, nanos = 0, scale = 100000000;
    if (*p == '+' || *p == '-') sign = *p++ == '-' ? -1 : 1;
    if (*p < '0' || *p > '9') return __atomic_load_n(&offset, __ATOMIC_RELAXED);
    while (*p >= '0' && *p <= '9') seconds = seconds * 10 + (*p++ - '0');
    if (*p == '.') {
        for (p++; *p >= '0' && *p <= '9'; p++, scale /= 10) nanos += (*p - '0') * scale;
    }
    int64_t read_offset = sign * (seconds * 1000000000 + nanos);
    __atomic_store_n(&offset, read_offset, __ATOMIC_RELAXED);
    return read_offset;
}

static int is_wall(clockid_t id) {
    return id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE || id == CLOCK_TAI
        || id == CLOCK_REALTIME_ALARM;
}

int clock_gettime(clockid_t id, struct timespec *ts) {
    int rc = machine_clock(id, ts);
    if (rc != 0 || !is_wall(id)) return rc;
    int64_t ns = (int64_t)ts->tv_sec * 1000000000 + ts->tv_nsec + offset_ns();
    ts->tv_sec = ns / 1000000000;
    ts->tv_nsec = ns % 1000000000;
    if (ts->tv_nsec < 0) { ts->tv_nsec += 1000000000; ts->tv_sec -= 1; }
    return 0;
}

int gettimeofday(struct timeval *tv, void *tz) {
    struct timespec ts;
    (void)tz;
    if (tv == NULL) return 0;
    if (clock_gettime(CLOCK_REALTIME, &ts) != 0) return -1;
    tv->tv_sec = ts.tv_sec;
    tv->tv_usec = ts.tv_nsec / 1000;
    return 0;
}

time_t time(time_t *out) {
    struct timespec ts;
    if (clock_gettime(CLOCK_REALTIME, &ts) != 0) return (time_t)-1;
    if (out != NULL) *out = ts.tv_sec;
    return ts.tv_sec;
}
"#;

/// How a preloaded library reaches a server kind's wall clock (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClockHook {
    /// Debian's libfaketime.
    Libfaketime,
    /// The harness's own library: for programs libfaketime cannot run.
    Own,
    /// No preloaded library reaches this kind's clock, for the reason given.
    Unreachable(&'static str),
}

impl ClockHook {
    /// How long after a jump a running server reads its clock moved, at most.
    pub fn lag(self) -> Duration {
        match self {
            ClockHook::Libfaketime => Duration::from_secs(2),
            ClockHook::Own => Duration::from_millis(10),
            ClockHook::Unreachable(_) => Duration::ZERO,
        }
    }
}

/// The wall clock a server runs on, as the clock-jump scenarios see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WallClock {
    /// A clock the harness moves ([`ServerControl::jump_clock`](super::ServerControl)).
    Movable,
    /// The machine's clock; the kind can start on a movable one (an option of its start).
    Real,
    /// The machine's clock, and no preloaded library reaches it, for the reason given.
    Fixed(&'static str),
}

/// A step of a server's wall clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClockJump {
    /// The clock jumps ahead by this much.
    Forward(Duration),
    /// The clock jumps back by this much.
    Back(Duration),
}

impl ClockJump {
    fn millis(self) -> i64 {
        let ms = |d: Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
        match self {
            ClockJump::Forward(by) => ms(by),
            ClockJump::Back(by) => -ms(by),
        }
    }
}

/// The wall clock of one server, offset from the machine's by what its file says.
#[derive(Debug)]
pub(crate) struct FakeClock {
    library: PathBuf,
    file: PathBuf,
    /// The offset now, in ms.
    offset: Mutex<i64>,
}

impl FakeClock {
    /// A clock file in `dir` (offset 0) and the library of `hook`, for server `label`.
    pub(crate) fn new(label: &str, dir: &Path, hook: ClockHook) -> Result<Self, HarnessError> {
        let library = match hook {
            ClockHook::Libfaketime => libfaketime()?,
            ClockHook::Own => own_library()?,
            ClockHook::Unreachable(why) => {
                return Err(HarnessError::io(
                    label,
                    "start on a movable clock",
                    std::io::Error::new(std::io::ErrorKind::Unsupported, why),
                ))
            }
        };
        let clock = FakeClock {
            library,
            file: dir.join("clock"),
            offset: Mutex::new(0),
        };
        clock.write(label, 0)?;
        Ok(clock)
    }

    /// The environment a server process runs with on this clock (the harness's own
    /// library reads only the file's name, and leaves the monotonic clocks alone anyway).
    pub(crate) fn env(&self) -> Vec<(OsString, OsString)> {
        vec![
            ("LD_PRELOAD".into(), self.library.clone().into_os_string()),
            (
                "FAKETIME_TIMESTAMP_FILE".into(),
                self.file.clone().into_os_string(),
            ),
            ("FAKETIME_CACHE_DURATION".into(), "1".into()),
            ("FAKETIME_DONT_FAKE_MONOTONIC".into(), "1".into()),
        ]
    }

    /// Moves the clock by `jump` (on top of the jumps before); the server reads it moved
    /// within [`ClockHook::lag`]. Returns the offset from the machine's clock now, in ms.
    pub(crate) fn jump(&self, label: &str, jump: ClockJump) -> Result<i64, HarnessError> {
        let mut offset = self.offset.lock().unwrap_or_else(PoisonError::into_inner);
        let moved = offset.saturating_add(jump.millis());
        self.write(label, moved)?;
        *offset = moved;
        Ok(moved)
    }

    /// Writes the offset `ms` whole: to a file beside, renamed over the clock file (both
    /// libraries open the file anew at every reading).
    fn write(&self, label: &str, ms: i64) -> Result<(), HarnessError> {
        let sign = if ms < 0 { '-' } else { '+' };
        let abs = ms.unsigned_abs();
        let text = format!("{sign}{}.{:03}s\n", abs / 1000, abs % 1000);
        let next = self.file.with_extension("next");
        write_file(label, &next, &text)?;
        std::fs::rename(&next, &self.file)
            .map_err(|e| HarnessError::io(label, format!("move {}", self.file.display()), e))
    }
}

/// libfaketime: `$FAKETIME_LIB`, else where Debian puts it.
fn libfaketime() -> Result<PathBuf, HarnessError> {
    if let Some(path) = std::env::var_os("FAKETIME_LIB").filter(|v| !v.is_empty()) {
        return Ok(PathBuf::from(path));
    }
    FAKE_CLOCK_LIBS
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .ok_or(HarnessError::MissingBinary {
            binary: "libfaketime.so.1".to_owned(),
            hint: LIBFAKETIME_HINT,
        })
}

/// The harness's own library, compiled once per source (kept in the temp dir across runs;
/// compiled beside and renamed into place, so test binaries running at once never see it
/// half written).
fn own_library() -> Result<PathBuf, HarnessError> {
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let cc = find_binary("cc", "CC", CC_HINT)?;
    let built = BUILT.get_or_init(|| {
        // FNV-1a of the source: a changed source gets a library of its own.
        let hash = SHIM_SOURCE.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
        let dir = std::env::temp_dir().join(format!("distlock-wall-clock-{hash:016x}"));
        let library = dir.join("libwallclock.so");
        if library.is_file() {
            return Ok(library);
        }
        std::fs::create_dir_all(&dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
        let pid = std::process::id();
        let source = dir.join(format!("wallclock-{pid}.c"));
        let partial = dir.join(format!("libwallclock-{pid}.so"));
        std::fs::write(&source, SHIM_SOURCE)
            .map_err(|e| format!("write {}: {e}", source.display()))?;
        let out = std::process::Command::new(&cc)
            .args(["-shared", "-fPIC", "-O2", "-o"])
            .arg(&partial)
            .arg(&source)
            .arg("-ldl")
            .output()
            .map_err(|e| format!("run {}: {e}", cc.display()))?;
        let _ = std::fs::remove_file(&source);
        if !out.status.success() {
            return Err(format!(
                "{} could not compile the wall-clock library: {}",
                cc.display(),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        std::fs::rename(&partial, &library)
            .map_err(|e| format!("move {}: {e}", library.display()))?;
        Ok(library)
    });
    built.clone().map_err(|detail| {
        HarnessError::io(
            "wall clock",
            "build the wall-clock library",
            std::io::Error::other(detail),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probe::redis_command;
    use crate::{RedisOptions, RedisServer};

    const REPLY: Duration = Duration::from_secs(5);

    async fn redis(server: &RedisServer, args: &[&str]) -> String {
        redis_command(server.addr(), args, REPLY)
            .await
            .expect("redis answers")
    }

    /// The server's `TIME`, in seconds.
    async fn server_seconds(server: &RedisServer) -> i64 {
        let reply = redis(server, &["TIME"]).await;
        // `*2\r\n$10\r\n<seconds>\r\n$6\r\n<micros>\r\n`
        reply
            .lines()
            .nth(2)
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or_else(|| panic!("TIME answered {reply:?}"))
    }

    fn machine_seconds() -> i64 {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
        i64::try_from(now.expect("after 1970").as_secs()).expect("seconds")
    }

    #[tokio::test]
    async fn a_running_redis_follows_its_movable_clock() {
        let options = RedisOptions::default().movable_clock(true);
        let Some(server) = crate::or_skip(RedisServer::start_with(options).await) else {
            return;
        };
        assert_eq!(server.wall_clock(), WallClock::Movable);
        let drift = server_seconds(&server).await - machine_seconds();
        assert!(
            drift.abs() <= 1,
            "unmoved, the clock is the machine's: {drift} s"
        );
        redis(&server, &["SET", "held", "1", "PX", "60000"]).await;
        let step = Duration::from_secs(600);
        assert_eq!(
            server.jump_clock(ClockJump::Forward(step)).ok(),
            Some(600_000)
        );
        tokio::time::sleep(ClockHook::Own.lag() * 5).await;
        let drift = server_seconds(&server).await - machine_seconds();
        assert!((599..=601).contains(&drift), "{drift} s ahead");
        assert_eq!(redis(&server, &["EXISTS", "held"]).await.trim(), ":0");
        assert_eq!(
            server.jump_clock(ClockJump::Back(step * 2)).ok(),
            Some(-600_000)
        );
        tokio::time::sleep(ClockHook::Own.lag() * 5).await;
        let drift = server_seconds(&server).await - machine_seconds();
        assert!((-601..=-599).contains(&drift), "{drift} s behind");
    }

    /// Every backend the postmaster forks reads the moved clock: `now()` follows it.
    #[tokio::test]
    async fn a_running_postgres_follows_its_movable_clock() {
        let options = crate::PostgresOptions::default().movable_clock(true);
        let Some(server) = crate::or_skip(crate::PostgresServer::start_with(options).await) else {
            return;
        };
        assert_eq!(server.wall_clock(), WallClock::Movable);
        let seconds = || async {
            let sql = "select extract(epoch from now())::bigint";
            let value = server.query_value(sql).await.expect("now()");
            value.expect("a value").parse::<i64>().expect("seconds")
        };
        let drift = seconds().await - machine_seconds();
        assert!(drift.abs() <= 1, "unmoved: {drift} s");
        let step = Duration::from_secs(600);
        server.jump_clock(ClockJump::Forward(step)).expect("jump");
        tokio::time::sleep(ClockHook::Own.lag() * 5).await;
        let drift = seconds().await - machine_seconds();
        assert!((599..=601).contains(&drift), "{drift} s ahead");
    }

    #[tokio::test]
    async fn a_server_on_the_machines_clock_does_not_jump() {
        let Some(server) = crate::or_skip(RedisServer::start().await) else {
            return;
        };
        assert_eq!(server.wall_clock(), WallClock::Real);
        let err = server
            .jump_clock(ClockJump::Forward(Duration::from_secs(1)))
            .expect_err("no movable clock");
        assert!(err.to_string().contains("machine's clock"), "{err}");
    }
}
