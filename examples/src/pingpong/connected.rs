//! RC and UC: one QP, optionally with its message in device memory (`-j`).

use super::*;

pub(super) struct Side {
    pub(super) qp: QueuePair,
    pub(super) waiter: Waiter,
    pub(super) buf: RegisteredBuffer,
    pub(super) size: u32,
    pub(super) inline: bool,
    /// With `-j`: the device memory that holds the message instead of `buf` (which then only
    /// stages what is copied in and out), and the zero-based region over it.
    pub(super) dm: Option<DmBuffer>,
    /// `-t`'s count of the clock between receives.
    pub(super) clock: RecvClock,
}

/// `-j`'s message buffer: `size` bytes of device memory and the region over it.
pub(super) struct DmBuffer {
    pub(super) dm: DeviceMemory,
    pub(super) mr: Arc<MemoryRegion>,
}

impl Side {
    /// The message's scatter/gather entry: the first `size` bytes of the device memory's
    /// region (zero-based, so at address 0) with `-j`, of `buf` otherwise.
    pub(super) fn message_sge(&self, which: &str) -> Result<Sge, CliError> {
        let size = self.size as usize;
        match &self.dm {
            Some(d) => d.mr.sge(0..size),
            None => self.buf.sge(0..size),
        }
        .ok_or_else(|| CliError::run(format!("the {which} buffer is smaller than -s")))
    }
}

/// `-j`, as `ibv_rc_pingpong` sets it up: the device must have device memory, at least
/// `size` bytes of it; the region over it is zero-based. Fails with rdma-core's words.
pub(super) fn open_dm(
    ctx: &Arc<DeviceContext>,
    pd: &Arc<sideway::protection_domain::ProtectionDomain>,
    size: usize,
) -> Result<DmBuffer, CliError> {
    let attr = ctx
        .query_device()
        .map_err(|e| CliError::run(format!("Couldn't query device for its features: {e}")))?;
    let max = attr.max_dm_size();
    if max == 0 {
        return Err(CliError::run(format!(
            "Device doesn't support dm allocation ({} has no device memory: max_dm_size is 0)",
            ctx.name()
        )));
    }
    if max < size as u64 {
        return Err(CliError::run(format!(
            "Device memory is insufficient ({} has {max} bytes of device memory, -s asks for \
             {size})",
            ctx.name()
        )));
    }
    let dm = ctx
        .alloc_dm(size, 0)
        .map_err(|e| CliError::run(format!("Dev mem allocation failed: {e}")))?;
    let mr = pd
        .reg_dm_mr(&dm, 0, size, AccessFlags::LOCAL_WRITE)
        .map_err(|e| CliError::run(format!("Couldn't register MR: {e}")))?;
    Ok(DmBuffer { dm, mr })
}

impl PingSide for Side {
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

    fn received_at(&mut self, ts: u64) {
        self.clock.receive(ts);
    }

    fn post_recvs(&mut self, n: u32) -> Result<(), CliError> {
        let sge = self.message_sge("receive")?;
        let mut guard = self.qp.start_post_recv();
        for _ in 0..n {
            guard.recv(RECV_WRID, &[sge]);
        }
        guard.post().map_err(CliError::run)
    }

    fn post_send(&mut self) -> Result<(), CliError> {
        let size = self.size as usize;
        let sge = self.message_sge("send")?;
        let mut guard = self.qp.start_post_send();
        if self.inline {
            let data = self
                .buf
                .inline(0..size)
                .ok_or_else(|| CliError::run("the send buffer is smaller than -s"))?;
            guard.wr(SEND_WRID, SendFlags::SIGNALED).send(data);
        } else {
            guard.wr(SEND_WRID, SendFlags::SIGNALED).send(sge);
        }
        guard.post().map_err(CliError::run)
    }
}

pub(super) fn open_side(
    ctx: &Arc<DeviceContext>,
    args: &PingpongArgs,
    qp_type: QpType,
) -> Result<Side, CliError> {
    let pd = ctx.alloc_pd().map_err(CliError::run)?;
    let ts_mask = check_device(ctx, &args.memory, RC_ODP)?;
    let buf = register_buffer(&pd, args.size as usize, &args.memory, FILL)?;
    let dm = if args.use_dm {
        Some(open_dm(ctx, &pd, args.size as usize)?)
    } else {
        None
    };
    let waiter = Waiter::new(ctx, args.rx_depth + 1, args, qp_type)?;
    let cq = Arc::clone(&waiter.cq);
    let mut qp_builder = pd.create_qp_builder();
    qp_builder
        .qp_type(qp_type)
        .send_cq(&cq)
        .recv_cq(&cq)
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
    // Inline data is copied from host memory: not with the message in device memory.
    let inline = qp.cap().max_inline_data >= args.size && dm.is_none();
    Ok(Side {
        qp,
        waiter,
        buf,
        size: args.size,
        inline,
        dm,
        clock: RecvClock::new(ts_mask),
    })
}

/// Runs one side of an RC or UC pingpong (server when `args.server` is `None`) and prints
/// what rdma-core's programs print.
pub fn run_connected(args: &PingpongArgs, qp_type: QpType) -> Result<(), CliError> {
    let mtu = args.check()?;
    let (ctx, gid, lid) = open_checked(args)?;
    let mut side = open_side(&ctx, args, qp_type)?;
    let psn = random_psn();
    let mut opts = ConnectOptions::new();
    opts.port_num(args.ib_port)
        .path_mtu(mtu)
        .sq_psn(psn)
        .sl(args.sl)
        .qp_access_flags(AccessFlags::empty());
    if let Some(g) = args.gid_idx {
        opts.gid_index(g);
    }
    let local = Endpoint {
        lid,
        qp_num: side.qp.qp_num(),
        psn,
        gid,
    };
    print_endpoint("local address:", &local);

    let remote = match &args.server {
        Some(host) => {
            let remote =
                exchange::client_exchange(host, args.port, &local, args.exchange_timeout())
                    .map_err(CliError::run)?;
            side.qp.connect(&opts, &remote).map_err(CliError::run)?;
            side.post_recvs(args.rx_depth)?;
            remote
        }
        None => {
            exchange::server_exchange(args.port, &local, args.exchange_timeout(), |peer| {
                // The receives must be up before the client learns our endpoint.
                side.qp
                    .connect(&opts, peer)
                    .map_err(CliError::run)
                    .and_then(|()| side.post_recvs(args.rx_depth))
                    .map_err(|e| e.to_string().into())
            })
            .map_err(CliError::run)?
        }
    };
    print_endpoint("remote address:", &remote);

    // The stride of -c's stamps, as in rdma-core's programs.
    let page = sideway::memory_region::page_size();
    if args.validate && args.server.is_some() {
        stamp_buffer(&mut side.buf, 0, page)?;
    }
    if let (Some(d), true) = (side.dm.as_mut(), args.server.is_some()) {
        // The client's message goes out of device memory: what buf holds (rdma-core's fill
        // and -c's stamps) is copied there first. The server's is whatever the peer sends.
        let bytes = side.buf.to_vec(0..side.buf.len()).map_err(CliError::run)?;
        d.dm.copy_to(0, &bytes)
            .map_err(|e| CliError::run(format!("Copy to dm buffer failed: {e}")))?;
    }
    let start = Instant::now();
    exchange(&mut side, args)?;
    let elapsed = start.elapsed();
    report(args, elapsed)?;
    for line in side.clock.lines() {
        println!("{line}");
    }
    if args.validate && args.server.is_none() {
        if let Some(d) = &side.dm {
            // With -j the messages landed in device memory. As rdma-core's programs: a line
            // per bad page, and the exit status unchanged.
            let mut bytes = side.buf.to_vec(0..side.buf.len()).map_err(CliError::run)?;
            d.dm.copy_from(0, &mut bytes)
                .map_err(|e| CliError::run(format!("Copy from DM buffer failed: {e}")))?;
            for n in invalid_pages(&bytes, page) {
                println!("invalid data in page {n}");
            }
        } else {
            report_invalid_pages(&side.buf, 0, page)?;
        }
    }
    Ok(())
}
