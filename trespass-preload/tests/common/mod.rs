//! What the preload's device tests share: the device gate, the library's path, running a
//! program with or without it (bounded), and reading the counters it writes.

#![allow(dead_code)] // not every test file uses every helper
#![allow(unreachable_pub)] // a module of each test crate, `pub` for its files

use std::collections::HashMap;
use std::ffi::OsStr;
use std::io::Read;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The longest any one program may run: a hang is a failure, never a stuck test.
pub const BOUND: Duration = Duration::from_secs(120);

/// rdma-core's rsocket preload (librdmacm), where Debian puts it.
pub const RSPRELOAD: &str = "/usr/lib/x86_64-linux-gnu/rsocket/librspreload.so";

/// The device's IPv4 address, or `None` after printing `skipped: <reason>` (a failure with
/// `RDMA_TEST_DEVICE` set and no device).
pub fn test_ip(test: &str) -> Option<IpAddr> {
    match sideway::testing::test_ip(test).unwrap_or_else(|e| panic!("{e}")) {
        sideway::testing::TestIp::Ready(ip) => Some(ip),
        sideway::testing::TestIp::Skip(line) => {
            println!("{line}");
            None
        }
    }
}

/// The shared object cargo built for this test: next to it in `target/<profile>/deps/`,
/// where `cargo test` rebuilds it (the copy in `target/<profile>/` is refreshed only by
/// `cargo build`). `TRESPASS_PRELOAD_LIB` names another (a release build, for the numbers
/// of docs/preload.md).
pub fn library() -> PathBuf {
    if let Some(lib) = std::env::var_os("TRESPASS_PRELOAD_LIB") {
        return PathBuf::from(lib);
    }
    let exe = std::env::current_exe().expect("the test's path");
    let lib = exe
        .parent()
        .expect("tests run from target/<profile>/deps")
        .join("libtrespass_preload.so");
    assert!(
        lib.exists(),
        "{} is missing: build the crate first",
        lib.display()
    );
    lib
}

/// A scratch directory of this test's own.
pub fn scratch(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("trespass-preload-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// What carries a program's connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Via {
    /// This library.
    Trespass,
    /// rdma-core's librspreload.
    Rsocket,
    /// Nothing: kernel TCP.
    Tcp,
}

impl Via {
    pub fn name(self) -> &'static str {
        match self {
            Via::Trespass => "trespass-preload",
            Via::Rsocket => "librspreload",
            Via::Tcp => "tcp",
        }
    }
}

/// How a program runs: under which preload, with which counters file and environment.
#[derive(Clone)]
pub struct Run {
    pub via: Via,
    pub stats: Option<PathBuf>,
    pub env: Vec<(String, String)>,
}

impl Run {
    /// Under this library, its counters appended to `stats`. The RDMA attempt may take up
    /// to 20 s: a loaded emulated guest has taken more than the default 2 s to set up a
    /// connection to a server whose pump was just starting, and a fallback to TCP would then
    /// fail the counters' checks (a test of the timeout itself sets its own).
    pub fn preloaded(stats: PathBuf) -> Run {
        Run {
            via: Via::Trespass,
            stats: Some(stats),
            env: vec![("TRESPASS_PRELOAD_TIMEOUT_MS".into(), "20000".into())],
        }
    }

    /// Over plain TCP.
    pub fn plain() -> Run {
        Run {
            via: Via::Tcp,
            stats: None,
            env: Vec::new(),
        }
    }

    /// Under `via`; this library's counters (if it is the one) in `stats`.
    pub fn via(via: Via, stats: PathBuf) -> Run {
        Run {
            via,
            stats: (via == Via::Trespass).then_some(stats),
            env: Vec::new(),
        }
    }

    pub fn env(mut self, k: &str, v: &str) -> Run {
        self.env.push((k.into(), v.into()));
        self
    }

    pub fn command(&self, program: impl AsRef<OsStr>, args: &[&str]) -> Command {
        let mut c = Command::new(program);
        c.args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        c.env_remove("LD_PRELOAD");
        for k in [
            "TRESPASS_PRELOAD",
            "TRESPASS_PRELOAD_PORTS",
            "TRESPASS_PRELOAD_NETS",
        ] {
            c.env_remove(k);
        }
        match self.via {
            Via::Trespass => {
                c.env("LD_PRELOAD", library());
            }
            Via::Rsocket => {
                c.env("LD_PRELOAD", RSPRELOAD);
            }
            Via::Tcp => {}
        }
        if let Some(s) = &self.stats {
            c.env("TRESPASS_PRELOAD_STATS", s);
        }
        for (k, v) in &self.env {
            c.env(k, v);
        }
        c
    }

    pub fn spawn(&self, program: impl AsRef<OsStr>, args: &[&str]) -> Child {
        let program = program.as_ref();
        self.command(program, args)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", program.to_string_lossy()))
    }
}

/// A server that is killed if the test fails before it ends it (a hung server left behind
/// would slow every later test in the guest).
pub struct Server(Option<Child>);

impl Server {
    pub fn new(child: Child) -> Server {
        Server(Some(child))
    }

    pub fn child(&mut self) -> &mut Child {
        self.0.as_mut().expect("the server was taken")
    }

    /// The child, for a test that ends it itself.
    pub fn take(mut self) -> Child {
        self.0.take().expect("the server was taken")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Waits for `child` at most `bound`, reading its output as it comes (a program that prints
/// more than a pipe holds must not stall on it); past the bound kills it and returns what it
/// printed as the error.
pub fn wait_bounded(mut child: Child, bound: Duration) -> Result<Output, Output> {
    fn drain(r: Option<impl Read + Send + 'static>) -> std::thread::JoinHandle<Vec<u8>> {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut r) = r {
                let _ = r.read_to_end(&mut buf);
            }
            buf
        })
    }
    let (out, err) = (drain(child.stdout.take()), drain(child.stderr.take()));
    let start = Instant::now();
    let mut late = false;
    let status = loop {
        if let Some(status) = child.try_wait().expect("waiting") {
            break status;
        }
        if start.elapsed() > bound {
            let _ = child.kill();
            late = true;
            break child.wait().expect("waiting");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    // A child's own children may hold the pipes open: collect what is there by then.
    let output = Output {
        status,
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
    };
    if late {
        Err(output)
    } else {
        Ok(output)
    }
}

/// Waits for `child` at most [`BOUND`], failing past that.
pub fn finish(child: Child, what: &str) -> Output {
    wait_bounded(child, BOUND)
        .unwrap_or_else(|out| panic!("{what} ran past {BOUND:?}: {}", show(&out)))
}

/// The status and the ends of stdout and stderr (4 KB each) of a run.
pub fn show(out: &Output) -> String {
    fn tail(b: &[u8]) -> String {
        let s = String::from_utf8_lossy(&b[b.len().saturating_sub(4096)..]).into_owned();
        if b.len() > 4096 {
            format!("[... {} bytes before]{s}", b.len() - 4096)
        } else {
            s
        }
    }
    format!(
        "{}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        tail(&out.stdout),
        tail(&out.stderr)
    )
}

/// The stdout of `child`, which must succeed within [`BOUND`].
pub fn ok(child: Child, what: &str) -> String {
    let out = finish(child, what);
    assert!(out.status.success(), "{what} failed: {}", show(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Waits until something listens on TCP `port` (any address), from /proc/net/tcp{,6}: a
/// probe connection would be one of the program's clients. An rsocket listener is no kernel
/// socket, so under librspreload this waits a fixed 3 s (or until the server exits: an
/// rdma_cm listener shows before redis-server aborts under librspreload, which these 3 s
/// see, where a client started at once would wait out its bound).
pub fn wait_listening(port: u16, child: &mut Child, via: Via) {
    let start = Instant::now();
    if via == Via::Rsocket {
        while start.elapsed() < Duration::from_secs(3) {
            if let Some(status) = child.try_wait().unwrap() {
                panic!("the server exited ({status}) before listening on {port}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        return;
    }
    loop {
        if listening_now(port) {
            return;
        }
        if let Some(status) = child.try_wait().unwrap() {
            panic!("the server exited ({status}) before listening on {port}");
        }
        assert!(
            start.elapsed() < BOUND,
            "nothing listened on {port} within {BOUND:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether a TCP socket (IPv4 or IPv6) listens on `port` now, as `/proc/net/tcp` and
/// `tcp6` say.
pub fn listening_now(port: u16) -> bool {
    let hex = format!(":{port:04X} ");
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|f| {
        std::fs::read_to_string(f)
            .unwrap_or_default()
            .lines()
            .any(|l| {
                let cols: Vec<&str> = l.split_whitespace().collect();
                cols.len() > 3 && format!("{} ", cols[1]).ends_with(&hex) && cols[3] == "0A"
            })
    })
}

/// A TCP port nothing listens on now (the kernel's choice, released at once).
pub fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
    l.local_addr().unwrap().port()
}

/// The counters of each process that wrote to `stats` (one line per process).
pub fn counters(stats: &Path) -> Vec<HashMap<String, u64>> {
    let text = std::fs::read_to_string(stats)
        .unwrap_or_else(|e| panic!("{}: {e} (no counters written)", stats.display()));
    text.lines()
        .map(|line| {
            assert!(line.starts_with("trespass-preload pid="), "{line}");
            line.split(' ')
                .skip(2)
                .map(|kv| {
                    let (k, v) = kv.split_once('=').unwrap_or_else(|| panic!("{line}"));
                    (k.to_owned(), v.parse().unwrap_or_else(|_| panic!("{line}")))
                })
                .collect()
        })
        .collect()
}

/// The counters of every process in `stats`, added up.
pub fn total(stats: &Path) -> HashMap<String, u64> {
    let mut sum = HashMap::new();
    for process in counters(stats) {
        for (k, v) in process {
            *sum.entry(k).or_insert(0) += v;
        }
    }
    sum
}

/// The one process's counters in `stats`, checked to be exactly `expect` where named and 0
/// elsewhere; but `connect_in_progress`, which says how a non-blocking connect went (it
/// returned `EINPROGRESS` before the RDMA answer came) and not where, only when named: a
/// program's own non-blocking connects count there or not as the answer's time falls.
pub fn assert_counters(stats: &Path, expect: &[(&str, u64)]) {
    let all = counters(stats);
    assert_eq!(
        all.len(),
        1,
        "one process wrote {}: {all:?}",
        stats.display()
    );
    for (k, v) in &all[0] {
        let named = expect.iter().find(|(n, _)| n == k);
        // Counted where they happen to, not where a test decides: how many connects
        // returned EINPROGRESS, how many data calls took the direct path.
        let incidental = [
            "connect_in_progress",
            "write_direct",
            "read_direct",
            "read_stood_in",
            "wait_stood_in",
        ];
        if named.is_none() && incidental.contains(&k.as_str()) {
            continue;
        }
        let want = named.map_or(0, |(_, n)| *n);
        assert_eq!(*v, want, "{k} in {}: {:?}", stats.display(), all[0]);
    }
}

/// The value of the first `key=value` word in `out`.
pub fn field<'a>(out: &'a str, key: &str) -> &'a str {
    out.split_whitespace()
        .find_map(|w| w.strip_prefix(key).and_then(|w| w.strip_prefix('=')))
        .unwrap_or_else(|| panic!("no {key}= in {out}"))
}

/// Where `program` is on PATH; `None` after printing `skipped: ...` when it is not there,
/// and a failure when `RDMA_TEST_DEVICE` is set (the rig's guest installs every program).
pub fn program(test: &str, program: &str) -> Option<PathBuf> {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(program))
            .find(|p| p.is_file())
    });
    if found.is_none() {
        assert!(
            std::env::var_os("RDMA_TEST_DEVICE").is_none(),
            "{test}: {program} is not installed (the SoftRoCE guest's packages include it)"
        );
        println!("skipped: {test}: {program} is not installed");
    }
    found
}
