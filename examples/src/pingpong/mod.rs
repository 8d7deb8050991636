//! The ping-pong that rdma-core's `ibv_rc_pingpong`, `ibv_uc_pingpong`, `ibv_ud_pingpong`
//! and `ibv_srq_pingpong` run, on sideway.
//!
//! Both sides post `rx_depth` receives, trade endpoints over TCP
//! ([`sideway::connection::exchange`]), and then bounce one `size`-byte SEND back and forth `iters`
//! times: the client sends first; each side sends its next message once its previous send and the
//! peer's message have both completed. Each side prints the two endpoints and the throughput and
//! time per iteration, in the same words as rdma-core's programs, so runs of the two can be
//! compared line by line.
//!
//! - [`run_connected`]: RC or UC, one QP.
//! - [`run_ud`]: UD, one QP, sending through an address handle built from the peer's
//!   endpoint; receive buffers keep 40 bytes of room for the GRH.
//! - [`run_srq`]: RC with `num_qp` QPs sharing one receive queue, one endpoint line per QP.
//!
//! With `-e`, a side sleeps on its CQ's completion channel instead of spinning on the CQ.
//!
//! Memory and completion options ([`MemoryFlags`]), as rdma-core's programs have them:
//! `-o` registers the buffer on demand (`IBV_ACCESS_ON_DEMAND`; rc and srq), `-O` uses an
//! implicit on-demand region instead and `-P` prefetches the buffer with `ibv_advise_mr`
//! (rc), `-t` reads each receive's completion timestamp from an extended CQ and prints the
//! clock cycles between receives (rc). A device without the feature ends the run with
//! rdma-core's own message, before anything is sent.

use std::io::{self, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use sideway::address_handle::{AddressHandle, AddressVector, GRH_LEN};
use sideway::async_event::EventError;
use sideway::completion_channel::CompletionChannel;
use sideway::completion_queue::{
    ClaimedCq, CompletionQueue, WcFlagsEx, WcOpcode, WcStatus, WorkCompletion,
};
use sideway::device::{DeviceContext, Mtu, OdpTransportCaps};
use sideway::device_memory::DeviceMemory;
use sideway::gid::Gid;
use sideway::memory_region::{AccessFlags, MemoryRegion, RegisteredBuffer, Sge};
use sideway::odp::{AdviseFlags, AdviseMr};
use sideway::protection_domain::ProtectionDomain;
use sideway::queue_pair::{ConnectOptions, Endpoint, QpType, QueuePair, SendFlags};
use sideway::shared_receive_queue::SharedReceiveQueue;

use crate::cli::CliError;
use sideway::connection::exchange;

mod connected;
mod endpoint;
mod messages;
mod options;
mod run_loop;
mod srq;
mod ud;
mod waiter;
pub use connected::*;
pub use endpoint::*;
pub use messages::*;
pub use options::*;
use run_loop::*;
pub use srq::*;
pub use ud::*;
pub use waiter::*;

const SEND_WRID: u64 = 1;
const RECV_WRID: u64 = 2;

/// Opens the device and checks the port as every variant does: RoCE needs `-g`.
fn open_checked(args: &PingpongArgs) -> Result<(Arc<DeviceContext>, Gid, u16), CliError> {
    let ctx = sideway::open_device(args.ib_dev.as_deref())?;
    let port = ctx.query_port(args.ib_port)?;
    if port.link_layer() == sideway::device::LinkLayer::Ethernet && args.gid_idx.is_none() {
        return Err(CliError::run(
            "this port is RoCE (Ethernet), which needs a GID: pass -g with a GID index \
             (show_gids lists them)",
        ));
    }
    let gid = match args.gid_idx {
        Some(g) => ctx.query_gid(args.ib_port, g)?.gid,
        None => Gid::ZERO,
    };
    Ok((ctx, gid, port.lid()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_stamps_and_checks_the_first_byte_of_every_page() {
        let mut buf = vec![FILL; 10_000];
        assert_eq!(invalid_pages(&buf, 4096), [0, 1, 2]);
        stamp_pages(&mut buf, 4096);
        assert_eq!((buf[0], buf[4096], buf[8192]), (STAMP, STAMP, STAMP));
        assert_eq!((buf[1], buf[4095], buf[9999]), (FILL, FILL, FILL));
        assert!(invalid_pages(&buf, 4096).is_empty());
        buf[4096] = FILL;
        assert_eq!(invalid_pages(&buf, 4096), [1]);
        assert!(sideway::memory_region::page_size() >= 4096);
    }

    fn completion(status: u32, wr_id: u64, byte_len: u32) -> WorkCompletion {
        WorkCompletion::from(sideway::sys::ibv_wc {
            status,
            wr_id,
            byte_len,
            opcode: sideway::sys::ibv_wc_opcode::IBV_WC_RECV,
            ..Default::default()
        })
    }

    /// A side whose completions are scripted, for [`exchange`]'s logic.
    struct ScriptedSide {
        /// What each wait returns, in order; an empty script stalls.
        script: std::collections::VecDeque<WorkCompletion>,
        sends: u32,
    }

    impl PingSide for ScriptedSide {
        fn post_send(&mut self) -> Result<(), CliError> {
            self.sends += 1;
            Ok(())
        }
        fn post_recvs(&mut self, _n: u32) -> Result<(), CliError> {
            Ok(())
        }
        fn wait(
            &mut self,
            wcs: &mut [WorkCompletion],
            progress: &dyn Fn() -> String,
        ) -> Result<usize, CliError> {
            match self.script.pop_front() {
                Some(wc) => {
                    wcs[0] = wc;
                    Ok(1)
                }
                None => Err(CliError::run(stall_message(
                    Duration::from_secs(30),
                    &progress(),
                    QpType::Rc,
                    1000,
                ))),
            }
        }
        fn stamp(&mut self, _i: usize) -> u64 {
            0
        }
    }

    fn args(server: Option<&str>, size: u32) -> PingpongArgs {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            common: PingpongArgs,
        }
        let size = size.to_string();
        let mut argv = vec!["pingpong", "-s", &size];
        argv.extend(server);
        <Cli as clap::Parser>::parse_from(argv).common
    }

    #[test]
    fn a_larger_server_answers_a_short_message_before_it_fails() {
        use sideway::sys::ibv_wc_status::*;
        // The peer's receive fails on our longer reply, which fails our send on RC.
        let send_done = WorkCompletion::from(sideway::sys::ibv_wc {
            status: IBV_WC_REM_INV_REQ_ERR,
            wr_id: SEND_WRID,
            opcode: sideway::sys::ibv_wc_opcode::IBV_WC_SEND,
            ..Default::default()
        });
        let mut side = ScriptedSide {
            script: [completion(IBV_WC_SUCCESS, RECV_WRID, 1024), send_done].into(),
            sends: 0,
        };
        let err = exchange(&mut side, &args(None, 4096))
            .unwrap_err()
            .to_string();
        assert!(err.contains("-s 4096"), "{err}");
        // The peer got its one reply (so that its receive fails too), and this side waited
        // for that send's completion before giving up.
        assert_eq!(side.sends, 1);
        assert!(side.script.is_empty());

        // A client's first send is still in flight when the short reply comes: no second.
        let mut side = ScriptedSide {
            script: [completion(IBV_WC_SUCCESS, RECV_WRID, 1024), send_done].into(),
            sends: 0,
        };
        let err = exchange(&mut side, &args(Some("host"), 4096))
            .unwrap_err()
            .to_string();
        assert!(err.contains("-s 4096"), "{err}");
        assert_eq!(side.sends, 1);
        assert!(side.script.is_empty());
    }

    #[test]
    fn a_different_srq_q_is_named_before_any_qp_is_connected() {
        let ep = |qp_num| Endpoint {
            qp_num,
            ..Endpoint::default()
        };
        // As ibv_srq_pingpong sends them: its -q lines, then zeros up to SRQ_WIRE_LINES.
        let wire = |q: u32| {
            let mut v: Vec<_> = (1..=q).map(|n| ep(0x100 + n)).collect();
            v.resize(SRQ_WIRE_LINES, Endpoint::default());
            v
        };
        let got = srq_peer_endpoints(&wire(4), 4).unwrap();
        assert_eq!(
            got.iter().map(|e| e.qp_num).collect::<Vec<_>>(),
            [0x101, 0x102, 0x103, 0x104]
        );
        let err = srq_peer_endpoints(&wire(2), 4).unwrap_err().to_string();
        assert_eq!(
            err,
            "the peer sent 2 QP endpoints, fewer than this side's 4 (-q 4): it runs with -q 2; \
             both sides need the same -q"
        );
        let err = srq_peer_endpoints(&wire(8), 4).unwrap_err().to_string();
        assert!(
            err.contains("sent 8 QP endpoints, more than this side's 4 (-q 4)"),
            "{err}"
        );
    }

    #[test]
    fn a_size_mismatch_is_named_from_the_completion() {
        use sideway::sys::ibv_wc_status::*;
        // The peer's -s is smaller: its messages arrive short.
        let short = completion(IBV_WC_SUCCESS, RECV_WRID, 1024);
        let err = check_completion(&short, 4096, 1024)
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "received a 1024-byte message where this side expects 4096 (-s 4096): the peer \
             runs with another message size; run both sides with the same -s"
        );
        assert!(check_completion(&completion(IBV_WC_SUCCESS, RECV_WRID, 4096), 4096, 4096).is_ok());
        // The peer's -s is larger: the receive or the send fails.
        for status in [
            IBV_WC_LOC_LEN_ERR,
            IBV_WC_LOC_QP_OP_ERR,
            IBV_WC_REM_INV_REQ_ERR,
            IBV_WC_REM_OP_ERR,
        ] {
            let err = check_completion(&completion(status, SEND_WRID, 0), 1024, 0)
                .unwrap_err()
                .to_string();
            assert!(
                err.ends_with(
                    "check that both sides use the same message size (this side runs with -s 1024)"
                ),
                "{err}"
            );
        }
        let err = check_completion(&completion(IBV_WC_RETRY_EXC_ERR, SEND_WRID, 0), 1024, 0)
            .unwrap_err()
            .to_string();
        assert!(!err.contains("-s"), "{err}");
    }

    #[test]
    fn the_stall_message_names_what_the_transport_can_have_and_n() {
        let progress = "500 sends and 500 receives";
        let rc = stall_message(Duration::from_secs(30), progress, QpType::Rc, 1000);
        assert_eq!(
            rc,
            "no completion for 30 s after 500 sends and 500 receives of -n 1000: the peer \
             stopped (with a smaller -n it is done already), is unreachable; check the peer's \
             output, and that both sides use the same -n"
        );
        let uc = stall_message(Duration::from_secs(30), progress, QpType::Uc, 1000);
        assert!(
            uc.contains("of -n 1000") && uc.contains("UC resends nothing"),
            "{uc}"
        );
        assert!(
            uc.ends_with("the same -n and the same message size (-s)"),
            "{uc}"
        );
        assert!(!uc.contains("UD"), "{uc}");
        let ud = stall_message(Duration::from_secs(30), progress, QpType::Ud, 1000);
        assert!(ud.contains("UD resends nothing"), "{ud}");
        assert!(
            ud.ends_with("the same -n and the same message size (-s)"),
            "{ud}"
        );
    }

    #[test]
    fn receive_clock_counts_as_ibv_rc_pingpong_does() {
        let mut c = RecvClock::new(0xffff);
        assert!(c.lines().is_empty());
        c.receive(100);
        assert!(
            c.lines().is_empty(),
            "the first receive only starts the count"
        );
        c.receive(130);
        c.receive(140);
        // Deltas 30, 10, 65380, and 32 across the wrap at the mask (0xfff0 -> 0x10).
        c.receive(0xfff0);
        c.receive(0x10);
        assert_eq!(
            c.lines(),
            [
                "Max receive completion clock cycles = 65380",
                "Min receive completion clock cycles = 10",
                "Average receive completion clock cycles = 16363.000000",
            ]
        );
    }

    #[test]
    fn memory_flags_follow_ibv_rc_pingpong() {
        let odp = |odp| OdpArg { odp };
        let more = |implicit_odp, prefetch, ts| RcMemoryArgs {
            implicit_odp,
            prefetch,
            ts,
        };
        assert_eq!(
            MemoryFlags::rc(&odp(false), &more(false, false, false), false).unwrap(),
            MemoryFlags::default()
        );
        let f = MemoryFlags::rc(&odp(false), &more(true, true, true), false).unwrap();
        assert!(
            f.odp && f.implicit_odp && f.prefetch && f.timestamps,
            "-O implies -o"
        );
        let e = MemoryFlags::rc(&odp(false), &more(false, true, false), false).unwrap_err();
        assert_eq!(
            e.to_string(),
            "prefetch is valid only with on-demand memory region"
        );
        assert!(MemoryFlags::rc(&odp(true), &more(false, true, false), false).is_ok());
        // -j with -o or -O is refused; -j alone is not.
        for (o, implicit) in [(true, false), (false, true)] {
            let e = MemoryFlags::rc(&odp(o), &more(implicit, false, false), true).unwrap_err();
            assert_eq!(e.to_string(), "DM memory region can't be on demand");
        }
        assert!(MemoryFlags::rc(&odp(false), &more(false, false, false), true).is_ok());
        assert!(RC_ODP.rc == OdpTransportCaps::SEND | OdpTransportCaps::RECV);
        assert!(SRQ_ODP.rc == OdpTransportCaps::SEND | OdpTransportCaps::SRQ_RECV);
    }

    #[test]
    fn psn_fits_24_bits() {
        for _ in 0..100 {
            assert!(random_psn() <= 0x00ff_ffff);
        }
    }
}
