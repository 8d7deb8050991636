//! SRQ: `num_qp` RC QPs receiving from one shared receive queue.

use super::*;

/// The SRQ side: `num_qp` RC QPs on one CQ, all receiving from one SRQ.
pub(super) struct SrqSide {
    pub(super) qps: Vec<QueuePair>,
    pub(super) srq: Arc<SharedReceiveQueue>,
    pub(super) waiter: Waiter,
    pub(super) buf: RegisteredBuffer,
    pub(super) size: usize,
    pub(super) inline: bool,
}

impl SrqSide {
    pub(super) fn post_recvs(&self, n: u32) -> Result<(), CliError> {
        let sge = self
            .buf
            .sge(0..self.size)
            .ok_or_else(|| CliError::run("the receive buffer is smaller than -s"))?;
        let mut guard = self.srq.start_post_recv();
        for _ in 0..n {
            guard.recv(RECV_WRID, &[sge]);
        }
        guard.post().map_err(CliError::run)
    }

    pub(super) fn post_send(&mut self, i: usize) -> Result<(), CliError> {
        let size = self.size;
        let sge = self
            .buf
            .sge(0..size)
            .ok_or_else(|| CliError::run("the send buffer is smaller than -s"))?;
        let inline = self.inline;
        let data = self
            .buf
            .inline(0..size)
            .ok_or_else(|| CliError::run("the send buffer is smaller than -s"))?;
        let mut guard = self.qps[i].start_post_send();
        if inline {
            guard.wr(SEND_WRID, SendFlags::SIGNALED).send(data);
        } else {
            guard.wr(SEND_WRID, SendFlags::SIGNALED).send(sge);
        }
        guard.post().map_err(CliError::run)
    }
}

/// Runs one side of an SRQ pingpong (server when `args.server` is `None`), as
/// `ibv_srq_pingpong` does: `num_qp` RC QPs receiving from one SRQ of `rx_depth`
/// receives, one endpoint line per QP each way, `iters` exchanges in all.
pub fn run_srq(args: &PingpongArgs, num_qp: u32) -> Result<(), CliError> {
    let mtu = args.check()?;
    if num_qp == 0 {
        return Err(CliError::run("-q must be at least 1"));
    }
    if num_qp > args.rx_depth {
        return Err(CliError::run(format!(
            "rx_depth {} is too small for {num_qp} QPs: each QP needs at least one receive",
            args.rx_depth
        )));
    }
    let (ctx, gid, lid) = open_checked(args)?;
    let size = args.size as usize;
    // As ibv_srq_pingpong: the device's ODP check comes before anything is made.
    check_device(&ctx, &args.memory, SRQ_ODP)?;
    let pd = ctx.alloc_pd().map_err(CliError::run)?;
    let buf = register_buffer(&pd, size, &args.memory, SRQ_FILL)?;
    let waiter = Waiter::new(&ctx, args.rx_depth + num_qp, args, QpType::Rc)?;
    let srq = pd
        .create_srq_builder()
        .max_wr(args.rx_depth)
        .max_sge(1)
        .build()
        .map_err(CliError::run)?;
    let mut qps = Vec::with_capacity(num_qp as usize);
    for _ in 0..num_qp {
        let mut b = pd.create_qp_builder();
        b.send_cq(&waiter.cq)
            .recv_cq(&waiter.cq)
            .srq(&srq)
            .max_send_wr(1)
            .max_recv_wr(1)
            .max_send_sge(1)
            .max_recv_sge(1);
        let qp = if args.new_send {
            b.build_ex()
        } else {
            b.build()
        }
        .map_err(CliError::run)?;
        qps.push(qp);
    }
    let inline = qps[0].cap().max_inline_data >= args.size;
    let mut side = SrqSide {
        qps,
        srq,
        waiter,
        buf,
        size,
        inline,
    };
    // Receives first: the peer may send as soon as it has our endpoints.
    side.post_recvs(args.rx_depth)?;
    let local: Vec<Endpoint> = side
        .qps
        .iter()
        .map(|qp| Endpoint {
            lid,
            qp_num: qp.qp_num(),
            psn: random_psn(),
            gid,
        })
        .collect();
    for ep in &local {
        print_endpoint("local address:", ep);
    }
    let mut opts = ConnectOptions::new();
    opts.port_num(args.ib_port)
        .path_mtu(mtu)
        .sl(args.sl)
        .qp_access_flags(AccessFlags::empty());
    if let Some(g) = args.gid_idx {
        opts.gid_index(g);
    }
    let n_qp = side.qps.len();
    let connect_all = |qps: &[QueuePair], remote: &[Endpoint]| -> Result<(), CliError> {
        for ((qp, me), peer) in qps.iter().zip(&local).zip(remote) {
            let mut o = opts;
            o.sq_psn(me.psn);
            qp.connect(&o, peer).map_err(CliError::run)?;
        }
        Ok(())
    };
    // ibv_srq_pingpong always trades SRQ_WIRE_LINES lines each way, the unused ones zero.
    let mut wire_local: Vec<_> = local.clone();
    wire_local.resize(SRQ_WIRE_LINES.max(local.len()), Endpoint::default());
    let remote: Vec<Endpoint> = match &args.server {
        Some(host) => {
            let remote = exchange::client_exchange_many(
                host,
                args.port,
                &wire_local,
                args.exchange_timeout(),
            )
            .map_err(CliError::run)?;
            let remote = srq_peer_endpoints(&remote, n_qp)?;
            connect_all(&side.qps, &remote)?;
            remote
        }
        None => {
            // A peer with another -q still gets our endpoints before this side fails: its
            // side can then end too (ibv_srq_pingpong's client waits for them forever).
            let mut other_q = None;
            let remote = exchange::server_exchange_many(
                args.port,
                &wire_local,
                args.exchange_timeout(),
                |peer| match srq_peer_endpoints(peer, n_qp) {
                    Ok(peer) => connect_all(&side.qps, &peer).map_err(|e| e.to_string().into()),
                    Err(e) => {
                        other_q = Some(e);
                        Ok(())
                    }
                },
            );
            // The mismatch is the news, whether or not the peer said "done" after it.
            if let Some(e) = other_q {
                return Err(e);
            }
            remote
                .map_err(CliError::run)?
                .iter()
                .take(n_qp)
                .copied()
                .collect()
        }
    };
    for ep in &remote {
        print_endpoint("remote address:", ep);
    }

    let page = sideway::memory_region::page_size();
    if args.validate && args.server.is_some() {
        stamp_buffer(&mut side.buf, 0, page)?;
    }
    let start = Instant::now();
    let (mut scnt, mut rcnt) = (0u64, 0u64);
    let mut routs = args.rx_depth;
    let mut pending = vec![RECV_WRID; n_qp];
    if args.server.is_some() {
        for (i, p) in pending.iter_mut().enumerate() {
            side.post_send(i)?;
            *p |= SEND_WRID;
        }
    }
    let mut wcs = vec![WorkCompletion::default(); 2 * n_qp];
    while rcnt < args.iters || scnt < args.iters {
        let n = side
            .waiter
            .wait(&mut wcs, &|| format!("{scnt} sends and {rcnt} receives"))?;
        for wc in &wcs[..n] {
            check_completion(wc, args.size, wc.byte_len())?;
            let i = side
                .qps
                .iter()
                .position(|qp| qp.qp_num() == wc.qp_num())
                .ok_or_else(|| {
                    CliError::run(format!("completion for unknown QP {:#x}", wc.qp_num()))
                })?;
            match wc.wr_id() {
                SEND_WRID => scnt += 1,
                RECV_WRID => {
                    rcnt += 1;
                    routs -= 1;
                    if routs <= num_qp {
                        side.post_recvs(args.rx_depth - routs)?;
                        routs = args.rx_depth;
                    }
                }
                id => {
                    return Err(CliError::run(format!(
                        "completion with unexpected wr_id {id}"
                    )))
                }
            }
            pending[i] &= !wc.wr_id();
            if scnt < args.iters && pending[i] == 0 {
                side.post_send(i)?;
                pending[i] = RECV_WRID | SEND_WRID;
            }
        }
    }
    report(args, start.elapsed())?;
    if args.validate && args.server.is_none() {
        report_invalid_pages(&side.buf, 0, page)?;
    }
    Ok(())
}
