//! UD: one QP sending through an address handle built from the peer's endpoint.

use super::*;

/// The UD side: a QP, its address handle for the peer, and one buffer with GRH room in
/// front (receives land at 0, sends go from [`GRH_LEN`]).
pub(super) struct UdSide {
    pub(super) qp: QueuePair,
    pub(super) waiter: Waiter,
    pub(super) buf: RegisteredBuffer,
    pub(super) ah: Option<Arc<AddressHandle>>,
    pub(super) remote_qpn: u32,
    pub(super) size: usize,
    pub(super) inline: bool,
}

impl PingSide for UdSide {
    fn wait(
        &mut self,
        wcs: &mut [WorkCompletion],
        progress: &dyn Fn() -> String,
    ) -> Result<usize, CliError> {
        self.waiter.wait(wcs, progress)
    }

    fn stamp(&mut self, i: usize) -> u64 {
        self.waiter.stamps[i]
    }

    fn payload_len(&self, byte_len: u32) -> u32 {
        // GRH_LEN is 40.
        byte_len.saturating_sub(GRH_LEN as u32)
    }

    fn post_recvs(&mut self, n: u32) -> Result<(), CliError> {
        let sge = self
            .buf
            .sge(0..GRH_LEN + self.size)
            .ok_or_else(|| CliError::run("the receive buffer is smaller than -s + 40"))?;
        let mut guard = self.qp.start_post_recv();
        for _ in 0..n {
            guard.recv(RECV_WRID, &[sge]);
        }
        guard.post().map_err(CliError::run)
    }

    fn post_send(&mut self) -> Result<(), CliError> {
        let ah = self
            .ah
            .as_ref()
            .ok_or_else(|| CliError::run("no address handle for the peer yet"))?;
        let data = GRH_LEN..GRH_LEN + self.size;
        let mut guard = self.qp.start_post_send();
        let wr = guard
            .wr(SEND_WRID, SendFlags::SIGNALED)
            .ud_addr(ah, self.remote_qpn, UD_QKEY);
        if self.inline {
            let bytes = self
                .buf
                .inline(data)
                .ok_or_else(|| CliError::run("the send buffer is smaller than -s + 40"))?;
            wr.send(bytes);
        } else {
            let sge = self
                .buf
                .sge(data)
                .ok_or_else(|| CliError::run("the send buffer is smaller than -s + 40"))?;
            wr.send(sge);
        }
        guard.post().map_err(CliError::run)
    }
}

impl UdSide {
    /// Readies the QP (Init, RTR, RTS with the Q_Key) and builds the address handle that
    /// reaches `remote`: global when the peer sent a GID.
    pub(super) fn connect(
        &mut self,
        args: &PingpongArgs,
        psn: u32,
        remote: &Endpoint,
    ) -> Result<(), CliError> {
        let mut opts = ConnectOptions::new();
        opts.port_num(args.ib_port).sq_psn(psn).qkey(UD_QKEY);
        self.qp.connect(&opts, remote).map_err(CliError::run)?;
        let mut av = AddressVector::new();
        av.set_dlid(remote.lid)
            .set_sl(args.sl)
            .set_port_num(args.ib_port);
        if !remote.gid.is_zero() {
            av.set_is_global(true)
                .set_dgid(remote.gid)
                .set_sgid_index(args.gid_idx.unwrap_or(0))
                .set_hop_limit(1);
        }
        self.ah = Some(self.qp.pd().create_ah(&av).map_err(CliError::run)?);
        self.remote_qpn = remote.qp_num;
        Ok(())
    }
}

/// Runs one side of a UD pingpong (server when `args.server` is `None`), as
/// `ibv_ud_pingpong` does: Q_Key 0x11111111, messages of at most the port's active MTU.
/// A size the user did not give (`size_given` false) shrinks to the MTU; one they gave
/// that is larger is an error.
pub fn run_ud(args: &PingpongArgs, size_given: bool) -> Result<(), CliError> {
    args.check()?;
    let (ctx, gid, lid) = open_checked(args)?;
    let mtu = ctx
        .query_port(args.ib_port)?
        .active_mtu()
        .bytes()
        .unwrap_or(256);
    let mut args = args.clone();
    if args.size > mtu {
        if size_given {
            return Err(CliError::run(format!(
                "requested size {} is larger than the port's MTU ({mtu})",
                args.size
            )));
        }
        args.size = mtu;
    }
    let args = &args;
    let size = args.size as usize;
    let pd = ctx.alloc_pd().map_err(CliError::run)?;
    let buf = register_buffer(&pd, GRH_LEN + size, &args.memory, FILL)?;
    let waiter = Waiter::new(&ctx, args.rx_depth + 1, args, QpType::Ud)?;
    let mut qp_builder = pd.create_qp_builder();
    qp_builder
        .qp_type(QpType::Ud)
        .send_cq(&waiter.cq)
        .recv_cq(&waiter.cq)
        .max_send_wr(1)
        .max_recv_wr(args.rx_depth)
        .max_send_sge(1)
        .max_recv_sge(1);
    let qp = if args.new_send {
        qp_builder.build_ex()
    } else {
        qp_builder.build()
    }
    .map_err(CliError::run)?;
    let inline = qp.cap().max_inline_data >= args.size;
    let mut side = UdSide {
        qp,
        waiter,
        buf,
        ah: None,
        remote_qpn: 0,
        size,
        inline,
    };
    let psn = random_psn();
    let local = Endpoint {
        lid,
        qp_num: side.qp.qp_num(),
        psn,
        gid,
    };
    print_ud_endpoint("local address:", &local);
    let remote = match &args.server {
        Some(host) => {
            let remote =
                exchange::client_exchange(host, args.port, &local, args.exchange_timeout())
                    .map_err(CliError::run)?;
            side.connect(args, psn, &remote)?;
            side.post_recvs(args.rx_depth)?;
            remote
        }
        None => exchange::server_exchange(args.port, &local, args.exchange_timeout(), |peer| {
            side.connect(args, psn, peer)
                .and_then(|()| side.post_recvs(args.rx_depth))
                .map_err(|e| e.to_string().into())
        })
        .map_err(CliError::run)?,
    };
    print_ud_endpoint("remote address:", &remote);

    // -c: as ibv_ud_pingpong, the stamps sit in the message, after the GRH room.
    let page = sideway::memory_region::page_size();
    if args.validate && args.server.is_some() {
        stamp_buffer(&mut side.buf, GRH_LEN, page)?;
    }
    let start = Instant::now();
    exchange(&mut side, args)?;
    report(args, start.elapsed())?;
    if args.validate && args.server.is_none() {
        report_invalid_pages(&side.buf, GRH_LEN, page)?;
    }
    Ok(())
}
