//! `trespass-compare`: trespass beside the raw verbs floor, rsocket and kernel TCP, the
//! runner of `scripts/trespass-compare` (statistics and table in
//! [`stride::trespass_compare`]).
//!
//! ```text
//! trespass-compare run [--rounds 3] [--sizes 8,64,...] [--jobs stream-lat,...] [--tsv FILE]
//! trespass-compare table FILE
//! ```
//!
//! `run` goes where the RDMA device is (`scripts/softroce run`, which sets RDMA_TEST_DEVICE,
//! RDMA_TEST_IP and RDMA_TEST_GID_INDEX): for each round, each size and each job (in an order
//! rotated by one every round) it starts the job's server, waits until it listens (rdma_cm
//! ids from `rdma res show cm_id`, TCP sockets from `ss`), runs its client, waits for both,
//! and appends the result to the TSV file as it goes. A run that fails (no result, an exit
//! status other than 0, a timeout) is recorded with its reason and the comparison goes on.
//! Then it prints the table. `table` prints the table of a TSV file again.

use std::fs::{self, File, OpenOptions};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use clap::{Args, Parser, Subcommand};
use stride::cli::Test;
use stride::report::{Report, SizeResult};
use stride::stream_bench::{StreamReport, StreamResult};
use stride::trespass_compare::{
    iterations, markdown_table, mib_per_sec, parse_jobs, parse_tsv, rdma_io_result,
    rstream_usec_per_xfer, summarize, write_tsv_line, Case, Job, Run, DEFAULT_JOBS,
    SPIN_BUSY_POLL_US, TOKIO_ADAPTIVE_MAX_US, TSV_HEADER,
};

/// trespass beside the raw verbs floor, rsocket (rstream) and kernel TCP.
#[derive(Debug, Parser)]
#[command(name = "trespass-compare", version)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Measure where the RDMA device is (inside `scripts/softroce run`), write the TSV file
    /// and print the table.
    Run(RunArgs),
    /// Print the table of a TSV file written by `run`.
    Table {
        /// The TSV file.
        tsv: PathBuf,
    },
}

#[derive(Debug, Args)]
struct RunArgs {
    /// The stride-perf binary (a release build).
    #[arg(long, default_value = "target/release/stride-perf")]
    stride_perf: PathBuf,

    /// The rdma-io-stream binary (benches/rdma-io-stream, a release build), for the rdma-io
    /// jobs.
    #[arg(long, default_value = "target/rdma-io-stream/release/rdma-io-stream")]
    rdma_io_stream: PathBuf,

    /// Rounds: each round runs every job at every size once.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    rounds: u32,

    /// Message sizes in bytes, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "8,64,4096,65536,1048576")]
    sizes: Vec<u64>,

    /// Jobs, comma-separated CASE-TEST: CASE one of stream, messages, spin, tokio,
    /// tokio-adaptive (trespass: stream bytes, messages, stream bytes with --busy-poll-us
    /// 1000000 on both sides, stream bytes through the tokio front end on both sides, the
    /// same with its adaptive spin fixed on by --busy-poll-max-us 750), rdma-io (the rdma-io
    /// crate's tokio stream, benches/rdma-io-stream), verbs (stride-perf send lat / write
    /// bw), rsocket (rstream), tcp (rstream -T s); TEST lat or bw.
    #[arg(long, default_value = DEFAULT_JOBS)]
    jobs: String,

    /// Where the raw numbers go (replaced).
    #[arg(long, default_value = "docs/data/trespass-perf.tsv")]
    tsv: PathBuf,

    /// A folder for the programs' output and JSON files.
    #[arg(long, default_value = "target/trespass-compare")]
    work: PathBuf,

    /// The first port; every run takes the next one (rdma_cm or TCP).
    #[arg(long, default_value_t = 19100)]
    first_port: u16,

    /// The source measured (commit and uncommitted changes), for the TSV file's notes.
    #[arg(long, default_value = "unknown")]
    revision: String,

    /// Seconds a client may run before it is killed and the run counted as failed.
    #[arg(long, default_value_t = 240)]
    client_timeout: u64,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let r = match cli.command {
        Cmd::Run(a) => run(&a),
        Cmd::Table { tsv } => table(&tsv).map(|t| print!("{t}")),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("trespass-compare: {e}");
            ExitCode::FAILURE
        }
    }
}

fn table(path: &Path) -> Result<String, String> {
    let text = fs::read_to_string(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    let tsv = parse_tsv(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut out = String::new();
    for n in &tsv.notes {
        out += &format!("{n}\n");
    }
    out.push('\n');
    out += &markdown_table(&summarize(&tsv.runs));
    Ok(out)
}

/// Where the device is, as `scripts/softroce run` says.
struct Device {
    name: String,
    ip: String,
    gid: String,
}

fn env(name: &str) -> Result<String, String> {
    std::env::var(name).map_err(|_| {
        format!("{name} is not set: run this where the RDMA device is, under scripts/softroce run")
    })
}

/// How to know a server is ready.
#[derive(Debug, Clone, Copy)]
enum Ready {
    /// An rdma_cm id listens on the port.
    Cm,
    /// A TCP socket listens on the port.
    Tcp,
}

/// Where the client's result is.
enum Extract {
    /// A `stride-perf stream --json` file.
    Stream(PathBuf),
    /// A `stride-perf send|write --json` file.
    Verbs(PathBuf),
    /// rstream's output.
    Rstream,
    /// `rdma-io-stream client`'s output.
    RdmaIo,
}

struct Spec {
    server: Vec<String>,
    client: Vec<String>,
    ready: Ready,
    extract: Extract,
}

fn spec(job: Job, size: u64, iters: u64, port: u16, dev: &Device, a: &RunArgs, tag: &str) -> Spec {
    let stride = a.stride_perf.display().to_string();
    let s = |v: &[&str]| v.iter().map(|x| (*x).to_owned()).collect::<Vec<String>>();
    let (size_s, iters_s, port_s) = (size.to_string(), iters.to_string(), port.to_string());
    let json = a.work.join(format!("{tag}.json"));
    let json_s = json.display().to_string();
    match job.case {
        Case::TrespassStream
        | Case::TrespassMessages
        | Case::TrespassLent
        | Case::TrespassSpin
        | Case::TrespassTokio
        | Case::TrespassTokioAdaptive => {
            let test = job.test.as_str();
            let mut client = s(&[
                &stride, "stream", test, "-s", &size_s, "-n", &iters_s, "-p", &port_s, "--json",
                &json_s,
            ]);
            let mut server = s(&[&stride, "stream", test, "--bind", &dev.ip, "-p", &port_s]);
            if job.case == Case::TrespassMessages {
                client.push("--messages".into());
            }
            if job.case == Case::TrespassLent {
                client.push("--lend".into());
            }
            if matches!(job.case, Case::TrespassTokio | Case::TrespassTokioAdaptive) {
                client.push("--tokio".into());
                server.push("--tokio".into());
            }
            if job.case == Case::TrespassTokioAdaptive {
                let max = [
                    "--busy-poll-max-us".to_owned(),
                    TOKIO_ADAPTIVE_MAX_US.to_string(),
                ];
                client.extend(max.clone());
                server.extend(max);
            }
            if job.case == Case::TrespassSpin {
                let spin = ["--busy-poll-us".to_owned(), SPIN_BUSY_POLL_US.to_string()];
                client.extend(spin.clone());
                server.extend(spin);
            }
            client.push(dev.ip.clone());
            Spec {
                server,
                client,
                ready: Ready::Cm,
                extract: Extract::Stream(json),
            }
        }
        Case::Verbs => {
            let (verb, test) = match job.test {
                Test::Lat => ("send", "lat"),
                Test::Bw => ("write", "bw"),
            };
            let common = s(&[
                &stride, verb, test, "-d", &dev.name, "-x", &dev.gid, "-s", &size_s, "-n",
                &iters_s, "-p", &port_s,
            ]);
            let mut client = common.clone();
            client.extend(s(&["--json", &json_s, &dev.ip]));
            Spec {
                server: common,
                client,
                ready: Ready::Tcp,
                extract: Extract::Verbs(json),
            }
        }
        Case::RdmaIo => {
            let bin = a.rdma_io_stream.display().to_string();
            let target = format!("{}:{port}", dev.ip);
            let side = |role: &str| s(&[&bin, role, &target, job.test.as_str(), &size_s, &iters_s]);
            Spec {
                server: side("serve"),
                client: side("client"),
                ready: Ready::Cm,
                extract: Extract::RdmaIo,
            }
        }
        Case::Rsocket | Case::Tcp => {
            let (count, iterations) = match job.test {
                Test::Lat => ("1".to_owned(), iters_s.clone()),
                Test::Bw => (iters_s.clone(), "1".to_owned()),
            };
            let mut common = s(&[
                "-p",
                &port_s,
                "-S",
                &size_s,
                "-C",
                &count,
                "-I",
                &iterations,
            ]);
            if job.case == Case::Tcp {
                common.extend(s(&["-T", "s"]));
            }
            let mut server = s(&["rstream", "-b", &dev.ip]);
            server.extend(common.iter().cloned());
            let mut client = s(&["rstream", "-s", &dev.ip]);
            client.extend(common);
            Spec {
                server,
                client,
                ready: if job.case == Case::Tcp {
                    Ready::Tcp
                } else {
                    Ready::Cm
                },
                extract: Extract::Rstream,
            }
        }
    }
}

/// Whether something listens on `port` the way `ready` says.
fn listening(ready: Ready, port: u16) -> bool {
    let out = match ready {
        Ready::Cm => Command::new("rdma").args(["res", "show", "cm_id"]).output(),
        Ready::Tcp => Command::new("ss")
            .args(["-Hltn", &format!("sport = :{port}")])
            .output(),
    };
    let Ok(out) = out else { return false };
    let text = String::from_utf8_lossy(&out.stdout);
    match ready {
        Ready::Cm => {
            let addr_end = format!(":{port}");
            text.lines().any(|l| {
                l.contains("state LISTEN")
                    && l.split_whitespace()
                        .skip_while(|w| *w != "src-addr")
                        .nth(1)
                        .is_some_and(|a| a.ends_with(&addr_end))
            })
        }
        Ready::Tcp => !text.trim().is_empty(),
    }
}

/// Waits for `child` at most `limit`; kills it past that. `None` when it was killed.
fn wait_for(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + limit;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
        }
    }
}

/// User + system CPU seconds of every child process reaped so far.
fn children_cpu() -> Option<f64> {
    // SAFETY: an all-zero rusage is a valid value of the plain C struct.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage writes one rusage through the pointer, which points at `usage`,
    // alive and writable for the call.
    let r = unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage) };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    (r == 0).then(|| secs(usage.ru_utime) + secs(usage.ru_stime))
}

fn spawn(argv: &[String], log: &Path) -> Result<Child, String> {
    let out = File::create(log).map_err(|e| format!("creating {}: {e}", log.display()))?;
    let err = out
        .try_clone()
        .map_err(|e| format!("duplicating {}: {e}", log.display()))?;
    Command::new(&argv[0])
        .args(&argv[1..])
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .map_err(|e| format!("starting {}: {e}", argv[0]))
}

/// The last line of `log` that says something, for a failed run's reason.
fn last_words(log: &Path) -> String {
    let text = fs::read_to_string(log).unwrap_or_default();
    text.lines()
        .rev()
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.starts_with("---"))
        .unwrap_or("(no output)")
        .chars()
        .take(300)
        .collect()
}

/// What one run gave: value, typical, CPU seconds and status.
struct Outcome {
    value: Option<f64>,
    typical: Option<f64>,
    cpu: Option<f64>,
    status: String,
}

fn failed(why: String) -> Outcome {
    Outcome {
        value: None,
        typical: None,
        cpu: None,
        status: format!("failed: {why}"),
    }
}

fn extract(
    spec: &Spec,
    test: Test,
    size: u64,
    client_log: &Path,
) -> Result<(f64, Option<f64>), String> {
    match &spec.extract {
        Extract::Stream(json) => {
            let r = StreamReport::read_json(json)?;
            match r.results.first() {
                Some(StreamResult::Latency(l)) => Ok((l.summary.t_avg, Some(l.summary.t_typical))),
                Some(StreamResult::Bandwidth(b)) => Ok((b.avg(false), None)),
                None => Err("no result in the JSON file".into()),
            }
        }
        Extract::Verbs(json) => {
            let r = Report::read_json(json)?;
            match r.this_side.results.first() {
                Some(SizeResult::Latency(l)) => Ok((l.summary.t_avg, Some(l.summary.t_typical))),
                Some(SizeResult::Bandwidth(b)) => Ok((b.avg(false), None)),
                None => Err("no result in the JSON file".into()),
            }
        }
        Extract::RdmaIo => {
            let text = fs::read_to_string(client_log).unwrap_or_default();
            rdma_io_result(&text).ok_or_else(|| "no result line in rdma-io-stream's output".into())
        }
        Extract::Rstream => {
            let text = fs::read_to_string(client_log).unwrap_or_default();
            let usec = rstream_usec_per_xfer(&text).ok_or("no result row in rstream's output")?;
            Ok(match test {
                Test::Lat => (usec, None),
                Test::Bw => (mib_per_sec(size, usec), None),
            })
        }
    }
}

fn run_one(spec: &Spec, test: Test, size: u64, port: u16, a: &RunArgs, tag: &str) -> Outcome {
    let server_log = a.work.join(format!("{tag}.server.log"));
    let client_log = a.work.join(format!("{tag}.client.log"));
    if let Extract::Stream(p) | Extract::Verbs(p) = &spec.extract {
        let _ = fs::remove_file(p);
    }
    let mut server = match spawn(&spec.server, &server_log) {
        Ok(c) => c,
        Err(e) => return failed(e),
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(Some(status)) = server.try_wait() {
            return failed(format!(
                "the server ended before it listened ({status}): {}",
                last_words(&server_log)
            ));
        }
        if listening(spec.ready, port) {
            break;
        }
        if Instant::now() > deadline {
            let _ = server.kill();
            let _ = server.wait();
            return failed(format!(
                "the server did not listen on port {port} within 30 s: {}",
                last_words(&server_log)
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let cpu_before = children_cpu();
    let client_status = match spawn(&spec.client, &client_log) {
        Ok(mut c) => wait_for(&mut c, Duration::from_secs(a.client_timeout)),
        Err(e) => {
            let _ = server.kill();
            let _ = server.wait();
            return failed(e);
        }
    };
    let server_status = wait_for(&mut server, Duration::from_secs(30));
    let cpu = match (cpu_before, children_cpu()) {
        (Some(b), Some(e)) => Some(e - b),
        _ => None,
    };
    let got = extract(spec, test, size, &client_log);
    let mut status = match (&client_status, &got) {
        (None, _) => format!(
            "failed: the client ran past {} s and was killed: {}",
            a.client_timeout,
            last_words(&client_log)
        ),
        (Some(s), Err(e)) => format!("failed: client {s}: {e}: {}", last_words(&client_log)),
        (Some(s), Ok(_)) if !s.success() => {
            format!("failed: client {s}: {}", last_words(&client_log))
        }
        (Some(_), Ok(_)) => "ok".to_owned(),
    };
    match server_status {
        None => status += "; the server did not end within 30 s and was killed",
        Some(s) if !s.success() => {
            status += &format!("; server {s}: {}", last_words(&server_log));
        }
        Some(_) => {}
    }
    let ok = status.starts_with("ok");
    let (value, typical) = match got {
        Ok((v, t)) if ok => (Some(v), t),
        _ => (None, None),
    };
    Outcome {
        value,
        typical,
        cpu,
        status,
    }
}

fn command_text(argv: &[&str]) -> String {
    Command::new(argv[0])
        .args(&argv[1..])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .filter(|t| !t.is_empty())
        .unwrap_or_else(|| "?".to_owned())
}

fn notes(a: &RunArgs, dev: &Device, jobs: &[Job]) -> Vec<String> {
    let names: Vec<String> = jobs.iter().map(|j| j.name()).collect();
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    vec![
        format!(
            "method: Made by `scripts/trespass-compare` in one SoftRoCE guest boot ({cpus} vCPUs), \
             every server and client on one device ({}, {}), the client connecting to its own \
             address. {} rounds; in each round every size, and at every size each job once \
             ({}), the jobs' order rotated by one from round to round. Iterations per size, \
             the same for every program: latency {} round trips, clamped to 50..1000; \
             bandwidth {} messages, clamped to 32..5000. Every program at its defaults \
             (trespass: busy poll at least 20 usec, adaptive up to 750 in a read after a write, 250 \
             otherwise, nodelay on, 256 KiB \
             ring; stride-perf: perftest's; \
             rstream: non-blocking calls, spinning), except the spin jobs: trespass with \
             --busy-poll-us {SPIN_BUSY_POLL_US} on both sides.",
            dev.name,
            dev.ip,
            a.rounds,
            names.join(", "),
            "16 MiB / size",
            "32 MiB / size"
        ),
        "columns: value is, for lat, the mean of one round trip / 2 in usec (stride-perf's \
         t_avg, which leaves out the two largest samples; rstream's usec/xfer, total time / 2 / \
         round trips) and, for bw, MiB/s (2^20 bytes) one way (rstream: one way then back, \
         size / usec/xfer); typical is stride-perf's t_typical (median), usec; cpu_s is the \
         user + system CPU seconds of server and client together, setup included"
            .to_owned(),
        format!(
            "{}; {}; clocksource {}",
            command_text(&["uname", "-r"]),
            command_text(&[
                "sh",
                "-c",
                "ibv_devinfo -d \"$RDMA_TEST_DEVICE\" | grep -m1 fw_ver | xargs"
            ]),
            command_text(&[
                "cat",
                "/sys/devices/system/clocksource/clocksource0/current_clocksource"
            ])
        ),
        format!("source: {}", a.revision),
        format!(
            "rdma-core {}, rdmacm-utils (rstream) {}, perftest {}",
            command_text(&["dpkg-query", "-W", "-f", "${Version}", "rdma-core"]),
            command_text(&["dpkg-query", "-W", "-f", "${Version}", "rdmacm-utils"]),
            command_text(&["dpkg-query", "-W", "-f", "${Version}", "perftest"]),
        ),
    ]
}

fn run(a: &RunArgs) -> Result<(), String> {
    let dev = Device {
        name: env("RDMA_TEST_DEVICE")?,
        ip: env("RDMA_TEST_IP")?,
        gid: env("RDMA_TEST_GID_INDEX")?,
    };
    let jobs = parse_jobs(&a.jobs)?;
    if jobs.is_empty() || a.sizes.is_empty() {
        return Err("nothing to run: give --jobs and --sizes".into());
    }
    if a.sizes
        .iter()
        .any(|&s| s == 0 || s > stride::stream_bench::MAX_SIZE)
    {
        return Err("sizes are 1 to 4194304 bytes".into());
    }
    if !a.stride_perf.exists() {
        return Err(format!(
            "{} does not exist: cargo build --release -p stride-perf",
            a.stride_perf.display()
        ));
    }
    fs::create_dir_all(&a.work).map_err(|e| format!("creating {}: {e}", a.work.display()))?;
    if let Some(dir) = a.tsv.parent().filter(|d| !d.as_os_str().is_empty()) {
        fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    }
    let mut tsv = OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .open(&a.tsv)
        .map_err(|e| format!("opening {}: {e}", a.tsv.display()))?;
    let mut head = String::new();
    for n in notes(a, &dev, &jobs) {
        head += &format!("# {n}\n");
    }
    head += TSV_HEADER;
    head.push('\n');
    tsv.write_all(head.as_bytes())
        .map_err(|e| format!("writing {}: {e}", a.tsv.display()))?;
    let started = Instant::now();
    let mut port = a.first_port;
    for round in 1..=a.rounds {
        for &size in &a.sizes {
            let shift = (round as usize - 1) % jobs.len();
            for &job in jobs[shift..].iter().chain(&jobs[..shift]) {
                let iters = iterations(job.test, size);
                let tag = format!("r{round}-{}-{size}", job.name());
                port = port.checked_add(1).unwrap_or(a.first_port);
                let spec = spec(job, size, iters, port, &dev, a, &tag);
                let o = run_one(&spec, job.test, size, port, a, &tag);
                let r = Run {
                    round,
                    test: job.test,
                    case: job.case,
                    size,
                    iterations: iters,
                    value: o.value,
                    typical: o.typical,
                    cpu_seconds: o.cpu,
                    status: o.status,
                };
                let line = write_tsv_line(&r);
                tsv.write_all(format!("{line}\n").as_bytes())
                    .and_then(|()| tsv.flush())
                    .map_err(|e| format!("writing {}: {e}", a.tsv.display()))?;
                let unit = match job.test {
                    Test::Lat => "usec",
                    Test::Bw => "MiB/s",
                };
                println!(
                    "[{:>5.0} s] round {round}/{} {:>8} B {:<14} {} {unit}{} {}",
                    started.elapsed().as_secs_f64(),
                    a.rounds,
                    size,
                    job.name(),
                    r.value
                        .map_or_else(|| "-".to_owned(), |v| format!("{v:.2}")),
                    r.typical
                        .map_or_else(String::new, |t| format!(" (typical {t:.2})")),
                    if r.status == "ok" { "" } else { &r.status }
                );
            }
        }
    }
    drop(tsv);
    let t = table(&a.tsv)?;
    let md = a.work.join("table.md");
    fs::write(&md, &t).map_err(|e| format!("writing {}: {e}", md.display()))?;
    println!("\n{t}");
    println!("raw numbers: {}; table: {}", a.tsv.display(), md.display());
    Ok(())
}
