//! The out-of-band channel: a TCP connection over which the two sides agree on the test,
//! trade queue-pair endpoints, synchronise, and hand over results.
//!
//! Every message is framed as `STRD`, a protocol version (u16, big-endian), a payload length
//! (u32, big-endian, at most [`MAX_PAYLOAD`]) and a JSON payload. A peer that is not
//! stride-perf, speaks another protocol version, or sends garbage is refused with a message
//! that says so; every read after the connection is up waits at most the channel's timeout,
//! so a peer that dies mid-run is an error, not a hang.
//!
//! Bytes are gathered into a reassembly buffer that never holds more than one frame, and a
//! frame is decoded only once it is whole. The measured loops' look at the channel
//! ([`OobChannel::peer_spoke`]) reads only what has already arrived, so a peer that sends part
//! of a frame cannot stall them; the rest of a begun frame must come within [`FRAME_LIMIT`]
//! (the peer writes each frame at once), or the run ends with an error naming the bytes.
//!
//! The files: `message` (the messages and the protocol's numbers), `error` ([`OobError`]),
//! `frame` (the frame codec), `channel` (the connection and its timed reads), `handshake`
//! (the opening: parameters, port profiles, endpoints) and `sync` (barriers and results).

mod channel;
mod error;
mod frame;
mod handshake;
mod message;
mod sync;

pub use channel::OobChannel;
pub use error::OobError;
pub use frame::{encode_frame, FrameBuffer};
pub use handshake::{check_endpoints, mismatch_error, MISMATCH_LINES_MAX};
pub use message::{
    DcEndpoint, Message, QpEndpoint, FRAME_LIMIT, MAGIC, MAX_24_BITS, MAX_PAYLOAD, PATH_MTUS,
    VERSION,
};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::TestParams;
    use crate::preflight::PortProfile;
    use crate::report::SideReport;
    use sideway::peer_text::PEER_TEXT_MAX;
    use std::io::{self, Write};
    use std::net::TcpListener;
    use std::thread;
    use std::time::{Duration, Instant};

    fn params(args: &[&str]) -> TestParams {
        crate::params::from_args(args).unwrap()
    }

    /// A connected pair over loopback.
    fn pair() -> (OobChannel, OobChannel) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let t = Duration::from_secs(5);
        let client = thread::spawn(move || OobChannel::connect("127.0.0.1", port, t).unwrap());
        let (s, _) = listener.accept().unwrap();
        (client.join().unwrap(), OobChannel::wrap(s, t).unwrap())
    }

    #[test]
    fn a_peers_results_with_a_number_no_run_measures_are_refused() {
        let report = |avg: f64| SideReport {
            role: "server".into(),
            device: "rxe0".into(),
            gid_index: 0,
            buffer: None,
            memory_regions: None,
            clock: None,
            posting: None,
            polling: None,
            results: vec![crate::report::SizeResult::Bandwidth(
                crate::bandwidth::BandwidthResult {
                    bytes: 65536,
                    iterations: 5000,
                    peak_bytes_per_sec: None,
                    avg_bytes_per_sec: avg,
                    msg_rate_mpps: 0.016,
                    intervals: None,
                    cpu_util_percent: None,
                },
            )],
            intervals: vec![],
        };
        for (avg, want) in [
            (1e300, "of 1e300, more than"),
            (-2.0, "of -2.0, which is negative"),
        ] {
            let (mut c, mut s) = pair();
            let ours = report(1e9);
            let peer = thread::spawn(move || s.exchange_results(&report(avg)).map(|_| ()));
            let e = c.exchange_results(&ours).unwrap_err().to_string();
            assert!(
                e.starts_with("the peer at 127.0.0.1:")
                    && e.contains(&format!(
                        "sent results with the 65536-byte row's average bandwidth (bytes/s) {want}"
                    )),
                "{e}"
            );
            // The honest side's numbers pass.
            peer.join().unwrap().unwrap();
        }
    }

    #[test]
    fn a_peer_that_leaves_before_its_port_description_is_named_once() {
        let ours = PortProfile {
            role: "client".into(),
            device: "rxe0".into(),
            port: 1,
            link: crate::preflight::LinkKind::Ethernet,
            active_mtu: 1024,
            gid: None,
            gid_from_x: false,
            table: vec![],
        };
        let (mut c, mut s) = pair();
        // The peer takes ours and leaves without sending its own.
        let peer = thread::spawn(move || drop(s.recv("port description")));
        let e = c.exchange_profiles(&ours).unwrap_err().to_string();
        peer.join().unwrap();
        assert!(
            e.starts_with("waiting for the peer's port description"),
            "{e}"
        );
        assert!(!e.contains("the peer's the peer's"), "{e}");
    }

    #[test]
    fn no_server_is_refused_at_once_with_the_step_and_address() {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let started = std::time::Instant::now();
        let e = OobChannel::connect("127.0.0.1", port, Duration::from_secs(15))
            .unwrap_err()
            .to_string();
        assert!(started.elapsed() < Duration::from_secs(1));
        assert_eq!(
            e,
            format!(
                "TCP connect to the stride-perf server at 127.0.0.1:{port}: connection refused: \
                 is the server running, on port {port}? A server takes one client per run and \
                 listens only while it waits for one, so a running server may be busy with \
                 another client, or have just ended its run: try again once that run is over \
                 and the server is started anew; else start it first with the same options \
                 and no address"
            )
        );
        let timed_out = OobError::Connect {
            addr: format!("127.0.0.1:{port}"),
            port,
            limit: Duration::from_secs(15),
            source: io::ErrorKind::TimedOut.into(),
        };
        let text = timed_out.to_string();
        let want = format!(
            ": no answer within 15 s: the address routes nowhere or a firewall drops it; \
             check the address and -p {port}"
        );
        assert!(text.ends_with(&want), "{text}");
    }

    #[test]
    fn a_second_client_of_a_busy_server_is_told_it_may_be_busy() {
        // A server that took its one client: its listener is gone while that run lasts.
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let first = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        let (_busy, _) = listener.accept().unwrap();
        drop(listener);
        let e = OobChannel::connect("127.0.0.1", port, Duration::from_secs(15)).unwrap_err();
        let text = e.to_string();
        assert!(text.contains("is the server running"), "{text}");
        assert!(text.contains("may be busy with another client"), "{text}");
        drop(first);
        // Only a refusal says so: a silent address is another matter.
        let timed_out = OobError::Connect {
            addr: format!("127.0.0.1:{port}"),
            port,
            limit: Duration::from_secs(15),
            source: io::ErrorKind::TimedOut.into(),
        };
        assert!(!timed_out.to_string().contains("busy"), "{timed_out}");
    }

    #[test]
    fn agreeing_sides_trade_endpoints_and_meet_at_barriers() {
        let (mut c, mut s) = pair();
        let p = params(&["write", "bw"]);
        let pc = p.clone();
        let ep = QpEndpoint {
            lid: 0,
            qpn: 17,
            psn: 5,
            gid: [1; 16],
            rkey: 9,
            addr: 0x1000,
            mtu: 1024,
            dc: None,
        };
        let client = thread::spawn(move || {
            c.client_handshake(&pc).unwrap();
            let theirs = c.exchange_endpoints(&[ep], 128).unwrap();
            c.barrier("start").unwrap();
            theirs
        });
        s.server_handshake(&p).unwrap();
        let theirs = s
            .exchange_endpoints(&[QpEndpoint { qpn: 18, ..ep }], 128)
            .unwrap();
        s.barrier("start").unwrap();
        assert_eq!(theirs, [ep]);
        assert_eq!(client.join().unwrap()[0].qpn, 18);
    }

    #[test]
    fn different_sizes_are_refused_on_both_sides() {
        let (mut c, mut s) = pair();
        let client = thread::spawn(move || {
            c.client_handshake(&params(&["write", "bw", "-s", "4096"]))
                .unwrap_err()
                .to_string()
        });
        let server_err = s
            .server_handshake(&params(&["write", "bw", "-s", "65536"]))
            .unwrap_err()
            .to_string();
        let client_err = client.join().unwrap();
        for e in [&server_err, &client_err] {
            assert!(
                e.contains("message size (-s/-a): server [65536], client [4096]"),
                "{e}"
            );
        }
    }

    #[test]
    fn garbage_version_and_silence_are_errors() {
        let (mut c, mut s) = pair();
        c.stream.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
        let e = s.recv("hello").unwrap_err().to_string();
        assert!(e.contains("not stride-perf"), "{e}");

        let (mut c, mut s) = pair();
        let mut frame = MAGIC.to_vec();
        frame.extend_from_slice(&99u16.to_be_bytes());
        frame.extend_from_slice(&2u32.to_be_bytes());
        frame.extend_from_slice(b"{}");
        c.stream.write_all(&frame).unwrap();
        let e = s.recv("hello").unwrap_err().to_string();
        assert!(e.contains("version 99"), "{e}");

        let (c, mut s) = pair();
        s.set_timeout(Duration::from_millis(200)).unwrap();
        let e = s.recv("results").unwrap_err().to_string();
        let peer = c.stream.local_addr().unwrap();
        assert_eq!(
            e,
            format!(
                "waiting for the peer's results (peer {peer}): no answer within 200 ms (did it \
                 die or hang? see its output)"
            )
        );
        drop(c);
        let e = s.recv("results").unwrap_err().to_string();
        assert!(e.contains("closed the connection"), "{e}");
    }

    #[test]
    fn peer_spoke_reads_ahead_and_notices_a_closed_peer() {
        let (mut c, mut s) = pair();
        assert!(!s.peer_spoke().unwrap());
        c.send(&Message::Ready {
            step: "done".into(),
        })
        .unwrap();
        // The frame may take a moment to arrive over loopback.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while !s.peer_spoke().unwrap() {
            assert!(
                std::time::Instant::now() < deadline,
                "the message never came"
            );
            thread::sleep(Duration::from_millis(5));
        }
        assert!(s.peer_spoke().unwrap(), "the message stays pending");
        // A peer that spoke and then died is noticed too: the message stays readable.
        let (c2, mut s2) = pair();
        let mut c2 = c2;
        c2.send(&Message::Ready {
            step: "done".into(),
        })
        .unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while !s2.peer_spoke().unwrap() {
            assert!(
                std::time::Instant::now() < deadline,
                "the message never came"
            );
            thread::sleep(Duration::from_millis(5));
        }
        drop(c2);
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        let closed = loop {
            match s2.peer_spoke() {
                Err(e) => break e.to_string(),
                Ok(spoke) => assert!(spoke),
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the close was never seen"
            );
            thread::sleep(Duration::from_millis(5));
        };
        assert!(closed.contains("closed the connection"), "{closed}");
        assert!(matches!(s2.recv("done"), Ok(Message::Ready { .. })));
        assert_eq!(
            s.recv("done").unwrap(),
            Message::Ready {
                step: "done".into()
            }
        );
        drop(c);
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            match s.peer_spoke() {
                Err(e) => {
                    assert!(e.to_string().contains("closed the connection"), "{e}");
                    break;
                }
                Ok(spoke) => assert!(!spoke),
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the close was never seen"
            );
            thread::sleep(Duration::from_millis(5));
        }
    }

    fn endpoint(qpn: u32, addr: u64) -> QpEndpoint {
        QpEndpoint {
            lid: 0,
            qpn,
            psn: 1,
            gid: [0; 16],
            rkey: 7,
            addr,
            mtu: 1024,
            dc: None,
        }
    }

    /// What `exchange_endpoints` on this side says when the peer sends `theirs`.
    fn trade(ours: Vec<QpEndpoint>, theirs: Vec<QpEndpoint>, len: u64) -> Result<usize, String> {
        let (mut c, mut s) = pair();
        let peer = thread::spawn(move || {
            // The peer sends its list whatever ours says.
            let _ = s.recv("endpoints");
            s.send(&Message::Endpoints { qps: theirs }).unwrap();
        });
        let got = c.exchange_endpoints(&ours, len);
        peer.join().unwrap();
        got.map(|v| v.len()).map_err(|e| e.to_string())
    }

    #[test]
    fn a_peer_with_too_few_or_too_many_endpoints_is_refused() {
        let four: Vec<_> = (0..4).map(|q| endpoint(q, 0x1000)).collect();
        let e = trade(four.clone(), four[..1].to_vec(), 128).unwrap_err();
        assert!(
            e.contains("the peer sent 1 QP endpoints, but this run has 4 QPs (-q 4)"),
            "{e}"
        );
        let e = trade(four[..2].to_vec(), Vec::new(), 128).unwrap_err();
        assert!(e.contains("the peer sent 0 QP endpoints"), "{e}");
        let e = trade(four[..1].to_vec(), four.clone(), 128).unwrap_err();
        assert!(
            e.contains("sent 4 QP endpoints, but this run has 1 QPs"),
            "{e}"
        );
        assert_eq!(trade(four.clone(), four, 128), Ok(4));
    }

    #[test]
    fn a_peer_buffer_past_the_address_space_is_refused() {
        let ours = vec![endpoint(1, 0x1000), endpoint(2, 0x1000)];
        let theirs = vec![endpoint(3, 0x1000), endpoint(4, u64::MAX - 100)];
        let e = trade(ours.clone(), theirs, 128).unwrap_err();
        assert!(
            e.contains("QP 1 advertised a 128-byte buffer at address 0xffffffffffffff9b"),
            "{e}"
        );
        // The largest address whose end (address + length) still fits in 64 bits is fine.
        let theirs = vec![endpoint(3, 0x1000), endpoint(4, u64::MAX - 127)];
        assert!(trade(ours.clone(), theirs, 128).is_err());
        let theirs = vec![endpoint(3, 0x1000), endpoint(4, u64::MAX - 128)];
        assert_eq!(trade(ours, theirs, 128), Ok(2));
    }

    #[test]
    fn a_peer_number_no_qp_may_have_is_refused_as_the_peers() {
        let ours = vec![endpoint(1, 0x1000), endpoint(2, 0x1000)];
        let ok = vec![endpoint(3, 0x1000), endpoint(MAX_24_BITS, 0x1000)];
        assert_eq!(trade(ours.clone(), ok.clone(), 128), Ok(2));
        let with = |f: &dyn Fn(&mut QpEndpoint)| {
            let mut theirs = ok.clone();
            f(&mut theirs[1]);
            trade(ours.clone(), theirs, 128).unwrap_err()
        };
        let e = with(&|ep| ep.qpn = u32::MAX);
        assert!(
            e.contains("the peer's QP 1 sent QP number 4294967295 (0xffffffff), over 24 bits"),
            "{e}"
        );
        let e = with(&|ep| ep.qpn = 1 << 24);
        assert!(
            e.contains("QP number 16777216 (0x1000000), over 24 bits"),
            "{e}"
        );
        let e = with(&|ep| ep.psn = 1 << 24);
        assert!(e.contains("the peer's QP 1 sent PSN 16777216"), "{e}");
        let e = with(&|ep| {
            ep.dc = Some(DcEndpoint {
                dctn: u32::MAX,
                key: 1,
            })
        });
        assert!(e.contains("sent DCT number 4294967295"), "{e}");
        let e = with(&|ep| ep.mtu = 0);
        assert!(
            e.contains("the peer's QP 1 sent MTU 0 (0x0), which is not a path MTU"),
            "{e}"
        );
        let e = with(&|ep| ep.mtu = 1500);
        assert!(e.contains("sent MTU 1500"), "{e}");
        for mtu in PATH_MTUS {
            let mut theirs = ok.clone();
            theirs[0].mtu = mtu;
            assert_eq!(trade(ours.clone(), theirs, 128), Ok(2), "MTU {mtu}");
        }
    }

    /// Calls `peer_spoke` every few milliseconds until it fails, checking that no call
    /// blocks and that it says nothing was spoken; returns the error.
    fn spoke_until_error(s: &mut OobChannel) -> String {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let call = Instant::now();
            let spoke = s.peer_spoke();
            let took = call.elapsed();
            assert!(
                took < Duration::from_millis(100),
                "peer_spoke blocked for {took:?}"
            );
            match spoke {
                Ok(spoke) => assert!(!spoke, "no whole message was sent"),
                Err(e) => return e.to_string(),
            }
            assert!(
                Instant::now() < deadline,
                "the stray bytes were never reported"
            );
            thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn a_stray_byte_does_not_block_the_measured_loop() {
        // A byte that may begin a frame, then nothing: the loop goes on until the rest is
        // overdue, then stops with an error that shows the byte.
        let (mut c, mut s) = pair();
        s.frame_limit = Duration::from_millis(300);
        let start = Instant::now();
        c.stream.write_all(b"S").unwrap();
        let e = spoke_until_error(&mut s);
        assert!(start.elapsed() >= Duration::from_millis(300), "{e}");
        assert!(
            e.contains("sent 1 bytes of a message (starting 53) and not the rest within 300ms"),
            "{e}"
        );
        assert!(e.contains("the peer at 127.0.0.1:"), "{e}");

        // A byte that cannot begin a frame is refused at once.
        let (mut c, mut s) = pair();
        c.stream.write_all(b"x").unwrap();
        let e = spoke_until_error(&mut s);
        assert!(e.contains("not stride-perf"), "{e}");

        // Half a header and half a payload, each finished later, are waited for.
        let (mut c, mut s) = pair();
        let mut frame = MAGIC.to_vec();
        frame.extend_from_slice(&VERSION.to_be_bytes());
        let payload = serde_json::to_vec(&Message::Ready {
            step: "done 8".into(),
        })
        .unwrap();
        frame.extend_from_slice(&u32::try_from(payload.len()).unwrap().to_be_bytes());
        frame.extend_from_slice(&payload);
        for piece in [&frame[..3], &frame[3..14], &frame[14..]] {
            assert!(!s.peer_spoke().unwrap());
            c.stream.write_all(piece).unwrap();
            thread::sleep(Duration::from_millis(20));
        }
        assert!(s.peer_spoke().unwrap());
        assert_eq!(
            s.recv("done").unwrap(),
            Message::Ready {
                step: "done 8".into()
            }
        );
    }

    #[test]
    fn recv_waits_for_the_rest_of_a_frame_only_so_long() {
        let (mut c, mut s) = pair();
        s.frame_limit = Duration::from_millis(300);
        c.stream.write_all(b"STR").unwrap();
        let start = Instant::now();
        // The channel's timeout is 5 s: the begun frame gets only the frame limit.
        let e = s.recv("results").unwrap_err().to_string();
        assert!(start.elapsed() < Duration::from_secs(2), "{e}");
        assert!(
            e.contains("sent 3 bytes of a message (starting 53 54 52)"),
            "{e}"
        );

        // A peer that closes mid-frame says so.
        let (mut c, mut s) = pair();
        c.stream.write_all(b"STRD").unwrap();
        drop(c);
        let e = s.recv("results").unwrap_err().to_string();
        assert!(e.contains("closed the connection"), "{e}");
        assert!(e.contains("4 bytes of a message had come"), "{e}");
    }

    /// Whether `text` would reach a terminal with no control character in it.
    fn is_printable(text: &str) -> bool {
        !text
            .chars()
            .any(|c| c.is_control() || ('\u{80}'..='\u{9f}').contains(&c))
    }

    #[test]
    fn peer_text_reaches_the_terminal_printable_and_cut() {
        let evil = format!(
            "\u{1b}]0;owned\u{7}\u{1b}[2J\u{9b}1A{}",
            "x".repeat(100_000)
        );
        let (mut c, mut s) = pair();
        c.abort(&evil);
        let e = s.recv("endpoints").unwrap_err().to_string();
        assert!(is_printable(&e), "{e:?}");
        assert!(
            e.starts_with("the peer stopped: \\x1b]0;owned\\x07\\x1b[2J\\u{9b}1Axxx"),
            "{e}"
        );
        assert!(e.len() < 1000, "{} bytes", e.len());
        let cut = evil.chars().count() - PEER_TEXT_MAX;
        assert!(
            e.ends_with(&format!("({cut} more characters not shown)")),
            "{e}"
        );

        // A refusal's lines, a step name, and what the decoder quotes.
        let (mut c, mut s) = pair();
        let client = thread::spawn(move || {
            c.client_handshake(&params(&["write", "bw"]))
                .unwrap_err()
                .to_string()
        });
        let _ = s.recv("hello");
        // 100 lines of 2,000 characters fit one message.
        let mut mismatches = vec![evil.chars().take(2000).collect::<String>(); 100];
        mismatches.push("last".into());
        s.send(&Message::Refuse { mismatches }).unwrap();
        let e = client.join().unwrap();
        assert!(is_printable(&e.replace('\n', "")), "{e:?}");
        assert!(e.contains("... and 69 more lines not shown"), "{e}");
        assert!(e.len() < 40_000, "{} bytes", e.len());

        let (mut c, mut s) = pair();
        let peer = thread::spawn(move || {
            let _ = c.recv("start");
            c.send(&Message::Ready { step: evil }).unwrap();
        });
        let e = s.barrier("start").unwrap_err().to_string();
        peer.join().unwrap();
        assert!(is_printable(&e), "{e:?}");
        assert!(e.contains("the peer \"\\x1b]0;owned"), "{e}");

        let (mut c, mut s) = pair();
        let payload = br#"{"type":"\u001b[2J\u009b31m"}"#;
        let mut frame = MAGIC.to_vec();
        frame.extend_from_slice(&VERSION.to_be_bytes());
        frame.extend_from_slice(&u32::try_from(payload.len()).unwrap().to_be_bytes());
        frame.extend_from_slice(payload);
        c.stream.write_all(&frame).unwrap();
        let e = s.recv("hello").unwrap_err().to_string();
        assert!(is_printable(&e), "{e:?}");
        assert!(e.contains("\\x1b[2J"), "{e}");
    }

    #[test]
    fn aborts_and_missing_servers_are_reported() {
        let (mut c, mut s) = pair();
        c.abort("device lost");
        let e = s.recv("endpoints").unwrap_err().to_string();
        assert_eq!(e, "the peer stopped: device lost");
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let e = OobChannel::connect("127.0.0.1", port, Duration::from_secs(2))
            .unwrap_err()
            .to_string();
        assert!(e.contains("is the server running"), "{e}");
    }
}
