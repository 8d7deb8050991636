//! Fuzz targets for what stride-perf decodes of its peer's bytes: the out-of-band channel's
//! frames (fed in chunks of every size, as TCP may cut them), the messages inside them and
//! what this side does with each, and the result file that holds the peer's results. The
//! harness, and why it is proptest, is in `support/fuzz.rs` (shared with sideway's and the
//! examples' targets).
//!
//! Every target holds to: no input panics; every error's text is printable (peer text goes
//! through `sideway::peer_text`); valid encodings decode to what was encoded.

#[path = "../../sideway/tests/support/fuzz.rs"]
mod fuzz;

use std::io::{self, Read};

use clap::Parser;
use proptest::prelude::*;

use stride::bandwidth::BandwidthResult;
use stride::cli::Cli;
use stride::cluster::launcher::{parse_host_list, HOST_LIST_MAX};
use stride::cluster::wire::{self as cluster_wire, Control, PairJob, PairResult};
use stride::latency::LatencySummary;
use stride::oob::{
    check_endpoints, encode_frame, mismatch_error, FrameBuffer, Message, QpEndpoint, MAGIC,
    MAX_PAYLOAD, VERSION,
};
use stride::params::TestParams;
use stride::plot::{self, Quantity};
use stride::preflight;
use stride::report::{self, LatencyResult, Report, SideReport, SizeResult};

const MANIFEST_DIR: &str = env!("CARGO_MANIFEST_DIR");
/// How the refusal of a frame with a wrong magic starts.
const WRONG_MAGIC: &str = "the first bytes were";
/// A frame's header: magic, version, payload length.
const HEADER_LEN: usize = 10;

fn params(args: &[&str]) -> TestParams {
    let mut argv = vec!["stride-perf"];
    argv.extend_from_slice(args);
    let cli = Cli::try_parse_from(argv).expect("valid arguments");
    let (verb, a) = cli.command.run_args().expect("a run command");
    TestParams::resolve(verb, a).expect("parameters that resolve")
}

fn endpoint(qpn: u32, addr: u64) -> QpEndpoint {
    QpEndpoint {
        lid: 0,
        qpn,
        psn: 0x12_3456,
        gid: [
            0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x50, 0x54, 0, 0xff, 0xfe, 0x12, 0x34, 0x56,
        ],
        rkey: 0x1234,
        addr,
        mtu: 1024,
        dc: None,
    }
}

fn side(role: &str, results: Vec<SizeResult>) -> SideReport {
    SideReport {
        role: role.into(),
        device: "rxe0".into(),
        gid_index: 1,
        buffer: Some("host".into()),
        memory_regions: Some("one memory region shared by 2 QPs".into()),
        clock: Some("tsc, 23 ns per read".into()),
        posting: Some("ibv_wr_* (extended QPs)".into()),
        polling: Some("ibv_poll_cq (classic CQs)".into()),
        results,
        intervals: vec![],
    }
}

fn bandwidth(bytes: u64) -> SizeResult {
    SizeResult::Bandwidth(BandwidthResult {
        bytes,
        iterations: 5000,
        peak_bytes_per_sec: Some(2.5e9),
        avg_bytes_per_sec: 2.0e9,
        msg_rate_mpps: 0.03,
        intervals: None,
        cpu_util_percent: None,
    })
}

fn latency(bytes: u64) -> SizeResult {
    SizeResult::Latency(LatencyResult {
        bytes,
        iterations: 1000,
        summary: LatencySummary {
            t_min: 1.5,
            t_max: 30.0,
            t_typical: 2.0,
            t_avg: 2.1,
            t_stdev: 0.3,
            p99: 4.0,
            p99_9: 9.5,
        },
    })
}

/// One message of every kind, as a peer sends them.
fn messages() -> Vec<Message> {
    vec![
        Message::Hello {
            params: params(&["write", "bw"]),
        },
        Message::Hello {
            params: params(&["send", "lat", "-a", "-c", "UD"]),
        },
        Message::Agree,
        Message::Refuse {
            mismatches: vec!["message size (-s/-a): here [65536], peer [4096]".into()],
        },
        Message::Endpoints {
            qps: vec![
                endpoint(17, 0x7f00_0000_1000),
                endpoint(18, u64::MAX - 4096),
            ],
        },
        Message::Preflight {
            profile: profile("client"),
        },
        Message::Ready {
            step: "start".into(),
        },
        Message::Results {
            report: side("server", vec![bandwidth(64), bandwidth(65536)]),
        },
        Message::Results {
            report: side("client", vec![latency(2)]),
        },
        Message::Abort {
            reason: "device lost".into(),
        },
    ]
}

/// A SoftRoCE port's profile, on the IPv4 GID.
fn profile(role: &str) -> preflight::PortProfile {
    let gid = |index, family, address: &str| preflight::GidInfo {
        index,
        kind: preflight::GidKind::RoceV2,
        family,
        address: address.into(),
    };
    let table = vec![
        gid(0, preflight::Family::Ipv6LinkLocal, "fe80::1"),
        gid(1, preflight::Family::Ipv4, "::ffff:198.18.0.1"),
    ];
    preflight::PortProfile {
        role: role.into(),
        device: "rxe0".into(),
        port: 1,
        link: preflight::LinkKind::Ethernet,
        active_mtu: 1024,
        gid: Some(table[1].clone()),
        gid_from_x: false,
        table,
    }
}

/// Fails the case when an error's text could drive the terminal.
fn check_text(what: &str, text: &str) -> Result<(), TestCaseError> {
    prop_assert!(fuzz::harmless(text), "{what} is not printable: {text:?}");
    Ok(())
}

/// What this side does with each message a peer may send, so that none of it panics.
fn consume(msg: &Message) -> Result<(), TestCaseError> {
    match msg {
        Message::Hello { params: theirs } => {
            for ours in [params(&["write", "bw"]), params(&["read", "lat", "-a"])] {
                for line in ours.mismatches(theirs) {
                    check_text("a mismatch line", &line)?;
                }
                let _ = theirs.mismatches(&ours);
            }
        }
        Message::Refuse { mismatches } => {
            check_text("a refusal", &mismatch_error(mismatches).to_string())?;
        }
        Message::Endpoints { qps } => {
            for expected in [qps.len(), 1] {
                for len in [0, 4096, u64::MAX] {
                    if let Err(e) = check_endpoints(qps, expected, len) {
                        check_text("an endpoint error", &e.to_string())?;
                    }
                }
            }
        }
        Message::Results { report } => {
            if let Err(e) = report.check_numbers() {
                check_text("a refused number", &e.to_string())?;
            }
            for r in &report.results {
                let _ = report::header_for(r, false);
                let _ = report::row_for(r, false);
                let _ = report::row_for(r, true);
            }
            check_text(
                "the peer's role",
                &sideway::peer_text::printable(&report.role, sideway::peer_text::PEER_TEXT_MAX),
            )?;
        }
        Message::Preflight { profile: theirs } => {
            for role in ["server", "client"] {
                let theirs = theirs.clone().from_peer(role);
                let d = preflight::diagnose(&profile(role), &theirs, false);
                for line in d.errors.iter().chain(&d.notes) {
                    check_text("a pre-flight diagnosis", line)?;
                }
                check_text("a pre-flight summary", &profile(role).summary(&theirs))?;
            }
        }
        Message::Agree | Message::Ready { .. } | Message::Abort { .. } => {}
    }
    Ok(())
}

/// A source that hands out at most one chunk per read, as TCP may.
struct Chunked<'a, I> {
    bytes: &'a [u8],
    sizes: I,
}

impl<I: Iterator<Item = usize>> Read for Chunked<'_, I> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        let n = self
            .sizes
            .next()
            .unwrap_or(usize::MAX)
            .min(out.len())
            .min(self.bytes.len());
        let (now, rest) = self.bytes.split_at(n);
        out[..n].copy_from_slice(now);
        self.bytes = rest;
        Ok(n)
    }
}

/// How a stream of bytes decodes: the messages, then either how many bytes of an unfinished
/// frame were left at the end, or the error that ended it.
#[derive(Debug, PartialEq)]
struct Decoded {
    messages: Vec<Message>,
    end: Result<usize, String>,
}

/// Decodes `bytes` through a [`FrameBuffer`], read in chunks of `sizes`, the way the channel
/// reads its socket.
fn decode_stream(
    bytes: &[u8],
    sizes: impl Iterator<Item = usize>,
) -> Result<Decoded, TestCaseError> {
    let mut source = Chunked { bytes, sizes };
    let mut frames = FrameBuffer::new();
    let mut messages = Vec::new();
    let end = loop {
        let need = match frames.needs() {
            Ok(need) => need,
            Err(e) => break Err(e.to_string()),
        };
        prop_assert!(
            frames.len() + need <= HEADER_LEN + MAX_PAYLOAD as usize,
            "a frame of {} bytes is being gathered, over the limit",
            frames.len() + need
        );
        if need == 0 {
            match frames.take() {
                Ok(msg) => {
                    consume(&msg)?;
                    messages.push(msg);
                    prop_assert!(frames.is_empty(), "a taken frame leaves bytes behind");
                    continue;
                }
                Err(e) => break Err(e.to_string()),
            }
        }
        let got = frames
            .read_from(&mut source, need)
            .map_err(|e| TestCaseError::fail(format!("a read from memory failed: {e}")))?;
        prop_assert!(got <= need, "read {got} bytes where {need} were asked for");
        prop_assert!(
            frames.len() <= HEADER_LEN + MAX_PAYLOAD as usize,
            "the buffer holds more than a frame: {} bytes",
            frames.len()
        );
        if got == 0 {
            break Ok(frames.len());
        }
    };
    if let Err(e) = &end {
        check_text("a frame error", e)?;
    }
    // A wrong magic is refused at its first wrong byte, quoting the bytes that came so far:
    // how many depends on how the stream was cut, the refusal does not.
    let end = end.map_err(|e| match e.find(WRONG_MAGIC) {
        Some(at) => e[..at + WRONG_MAGIC.len()].to_owned(),
        None => e,
    });
    Ok(Decoded { messages, end })
}

fn frame(payload: &[u8]) -> Vec<u8> {
    let mut out = MAGIC.to_vec();
    out.extend_from_slice(&VERSION.to_be_bytes());
    out.extend_from_slice(
        &u32::try_from(payload.len())
            .unwrap_or(u32::MAX)
            .to_be_bytes(),
    );
    out.extend_from_slice(payload);
    out
}

/// The frame target: a byte stream decodes the same however it is cut, never panics, and
/// never gathers more than a frame.
#[test]
fn oob_frame() {
    let mut valid: Vec<Vec<u8>> = messages()
        .iter()
        .map(|m| encode_frame(m).expect("a sample message encodes"))
        .collect();
    // Two frames back to back, as a peer sends them.
    valid.push([valid[2].clone(), valid[5].clone()].concat());
    fuzz::fuzz_bytes(MANIFEST_DIR, "oob-frame", valid, |bytes| {
        let whole = decode_stream(bytes, std::iter::repeat(usize::MAX))?;
        let by_byte = decode_stream(bytes, std::iter::repeat(1))?;
        let chunked = decode_stream(bytes, fuzz::chunk_sizes(bytes))?;
        prop_assert_eq!(&whole, &by_byte, "whole and byte by byte differ");
        prop_assert_eq!(&whole, &chunked, "whole and in chunks differ");
        Ok(())
    });
}

/// The message target: any payload in a well-formed frame decodes or is refused with a
/// printable error, and what this side does with a decoded message never panics.
#[test]
fn oob_message() {
    let valid: Vec<Vec<u8>> = messages()
        .iter()
        .map(|m| serde_json::to_vec(m).expect("a sample message encodes"))
        .collect();
    fuzz::fuzz_bytes(MANIFEST_DIR, "oob-message", valid, |payload| {
        let mut frames = FrameBuffer::new();
        let framed = frame(payload);
        let mut source = framed.as_slice();
        loop {
            let need = match frames.needs() {
                Ok(need) => need,
                Err(e) => return check_text("a header error", &e.to_string()),
            };
            if need == 0 {
                break;
            }
            let got = frames
                .read_from(&mut source, need)
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert!(got > 0, "the frame ended early");
        }
        match frames.take() {
            Ok(msg) => consume(&msg),
            Err(e) => check_text("a message error", &e.to_string()),
        }
    });
}

/// Messages round-trip through their frames; an abort comes back as the peer's reason,
/// printable.
#[test]
fn oob_round_trip() {
    let endpoint = (
        any::<u16>(),
        any::<u32>(),
        any::<u32>(),
        any::<[u8; 16]>(),
        any::<u32>(),
        any::<u64>(),
        any::<u32>(),
    )
        .prop_map(|(lid, qpn, psn, gid, rkey, addr, mtu)| QpEndpoint {
            lid,
            qpn,
            psn,
            gid,
            rkey,
            addr,
            mtu,
            dc: None,
        });
    let message = prop_oneof![
        prop::collection::vec(endpoint, 0..8).prop_map(|qps| Message::Endpoints { qps }),
        any::<String>().prop_map(|step| Message::Ready { step }),
        prop::collection::vec(any::<String>(), 0..40)
            .prop_map(|mismatches| Message::Refuse { mismatches }),
        any::<String>().prop_map(|reason| Message::Abort { reason }),
        prop::sample::select(messages()),
    ];
    fuzz::fuzz_values("oob-round-trip", message, |msg| {
        let bytes = encode_frame(&msg).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let got = decode_stream(&bytes, fuzz::chunk_sizes(&bytes))?;
        match msg {
            Message::Abort { reason } => {
                let want = format!(
                    "the peer stopped: {}",
                    sideway::peer_text::printable(&reason, sideway::peer_text::PEER_TEXT_MAX)
                );
                prop_assert_eq!(
                    got,
                    Decoded {
                        messages: vec![],
                        end: Err(want)
                    }
                );
            }
            msg => prop_assert_eq!(
                got,
                Decoded {
                    messages: vec![msg],
                    end: Ok(0)
                }
            ),
        }
        Ok(())
    });
}

/// The result file target: a file (which holds the peer's results) either reads as a report
/// or not, and a report that reads plots and prints without panicking.
#[test]
fn result_file() {
    let report = |this: SideReport, peer: Option<SideReport>| Report {
        tool: "stride-perf".into(),
        version: "0.1.0".into(),
        params: params(&["write", "bw"]),
        report_gbits: false,
        this_side: this,
        peer,
    };
    let valid: Vec<Vec<u8>> = [
        report(
            side("client", vec![bandwidth(2), bandwidth(65536)]),
            Some(side("server", vec![])),
        ),
        report(
            side("server", vec![]),
            Some(side("client", vec![latency(64)])),
        ),
    ]
    .iter()
    .map(|r| serde_json::to_vec_pretty(r).expect("a sample report encodes"))
    .collect();
    fuzz::fuzz_bytes(MANIFEST_DIR, "result-file", valid, |bytes| {
        let Ok(report) = serde_json::from_slice::<Report>(bytes) else {
            return Ok(());
        };
        for r in plot::measured(&report) {
            let _ = report::row_for(r, report.report_gbits);
        }
        for quantity in [Quantity::Latency, Quantity::Bandwidth { gbits: true }] {
            if let Ok(series) = plot::series_of(&report, "fuzz".into(), quantity) {
                let svg = plot::render("fuzz", quantity, &[series]);
                prop_assert!(svg.ends_with("</svg>\n"));
            }
        }
        Ok(())
    });
}

/// The host-list target: any text expands or is refused with a printable error; never more
/// than the stated bound of hosts, each without brackets or commas.
#[test]
fn cluster_host_list() {
    let valid = vec![
        b"node[01-03,07]".to_vec(),
        b"gpu[8-10]-ib,login1".to_vec(),
        b"r[1-2]n[001-002]".to_vec(),
    ];
    fuzz::fuzz_bytes(MANIFEST_DIR, "cluster-host-list", valid, |bytes| {
        let text = String::from_utf8_lossy(bytes);
        match parse_host_list(&text) {
            Ok(hosts) => {
                prop_assert!(hosts.len() <= HOST_LIST_MAX);
                for h in &hosts {
                    prop_assert!(
                        !h.contains(['[', ']', ',']),
                        "{h:?} from {text:?} kept a bracket or comma"
                    );
                }
                Ok(())
            }
            Err(e) => check_text("a host list error", &e.to_string()),
        }
    });
}

/// The cluster control target: any bytes decode to one message or are refused with a
/// printable error; valid messages round-trip.
#[test]
fn cluster_control() {
    let valid: Vec<Vec<u8>> = [
        Control::Heartbeat,
        Control::Abort {
            reason: "rank 2 (host n03, pid 7) closed the connection".into(),
        },
        Control::Step {
            index: 1,
            jobs: vec![PairJob {
                client: 0,
                server: 1,
            }],
        },
        Control::StepDone {
            index: 1,
            results: vec![PairResult {
                pair: PairJob {
                    client: 0,
                    server: 1,
                },
                client: side("client", vec![bandwidth(65536)]),
                server: side("server", Vec::new()),
            }],
        },
    ]
    .iter()
    .map(|m| {
        let payload = serde_json::to_vec(m).expect("a sample message encodes");
        let mut frame = b"STRC\0\x01".to_vec();
        frame.extend_from_slice(&u32::try_from(payload.len()).unwrap_or(0).to_be_bytes());
        frame.extend_from_slice(&payload);
        frame
    })
    .collect();
    fuzz::fuzz_bytes(
        MANIFEST_DIR,
        "cluster-control",
        valid,
        |bytes| match cluster_wire::recv(&mut io::Cursor::new(bytes)) {
            Ok(msg) => {
                let again =
                    serde_json::to_vec(&msg).map_err(|e| TestCaseError::fail(e.to_string()))?;
                let back: Control = serde_json::from_slice(&again)
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                prop_assert_eq!(back, msg);
                Ok(())
            }
            Err(e) => check_text("a control error", &e.to_string()),
        },
    );
}
