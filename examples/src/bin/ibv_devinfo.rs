//! `ibv_devinfo`: what RDMA devices and their ports say about themselves, laid out like
//! rdma-core's `ibv_devinfo` (the same fields, names, values and tab alignment), so the two
//! can be compared line by line.

use std::io::{self, Write};
use std::process::ExitCode;

use clap::Parser;
use sideway::device::{Device, DeviceAttr, DeviceContext, GidEntry, PortAttr};
use sideway_examples::cli::{exit_status, log_to_stderr, select_devices, CliError};
use sideway_examples::device_text::{
    self as text, field, flag_lines, DEVICE_CAP_FLAGS_EX_NAMES, DEVICE_COLUMN, ODP_GENERAL_NAMES,
    ODP_TRANSPORT_NAMES, PORT_COLUMN, QP_TYPE_NAMES, RSS_COLUMN,
};

/// Prints the attributes of RDMA devices and their ports.
#[derive(Debug, Parser)]
#[command(name = "ibv_devinfo", version)]
struct Args {
    /// Only this RDMA device (default: every device)
    #[arg(short = 'd', long = "ib-dev", value_name = "DEVICE")]
    ib_dev: Option<String>,

    /// Only this port of the device, numbered from 1 (default: every port)
    #[arg(short = 'i', long = "ib-port", value_name = "PORT")]
    ib_port: Option<u8>,

    /// Print only the names of the devices
    #[arg(short = 'l', long)]
    list: bool,

    /// Also print the device's limits and capabilities, every port attribute, and the GIDs
    #[arg(short = 'v', long)]
    verbose: bool,
}

/// The lines of one device-level field.
fn dev(label: &str, value: impl std::fmt::Display) -> String {
    field(1, label, value, DEVICE_COLUMN)
}

/// The lines of one port-level field.
fn port(label: &str, value: impl std::fmt::Display) -> String {
    field(3, label, value, PORT_COLUMN)
}

fn run(args: &Args) -> Result<(), CliError> {
    let devices = select_devices(args.ib_dev.as_deref())?;
    let mut out = io::stdout().lock();
    if args.list {
        let plural = if devices.len() == 1 { "" } else { "s" };
        writeln!(out, "{} HCA{plural} found:", devices.len())?;
        for d in &devices {
            writeln!(out, "\t{}", d.name())?;
        }
        writeln!(out)?;
        return Ok(());
    }
    for device in &devices {
        // Everything about a device is gathered before any of it is printed, so a bad port or
        // a failed query prints an error and no half of a device.
        for line in device_lines(device, args)? {
            writeln!(out, "{line}")?;
        }
    }
    out.flush()?;
    Ok(())
}

fn device_lines(device: &Device, args: &Args) -> Result<Vec<String>, CliError> {
    let ctx = device.open()?;
    let attr = ctx.query_device()?;
    let ports: Vec<u8> = match args.ib_port {
        Some(p) => {
            // Fails with "DEV has no port N; its ports are 1..=M" for a port that is not there.
            ctx.query_port(p)?;
            vec![p]
        }
        None => (1..=attr.phys_port_cnt()).collect(),
    };
    let mut lines = vec![
        format!("hca_id:\t{}", ctx.name()),
        dev("transport:", text::transport(device.transport_type())),
        dev("fw_ver:", attr.fw_ver()),
        dev("node_guid:", text::guid(attr.node_guid())),
        dev("sys_image_guid:", text::guid(attr.sys_image_guid())),
        dev("vendor_id:", format_args!("{:#06x}", attr.vendor_id())),
        dev("vendor_part_id:", attr.vendor_part_id()),
        dev("hw_ver:", format_args!("{:#X}", attr.hw_ver())),
        dev("phys_port_cnt:", attr.phys_port_cnt()),
    ];
    if args.verbose {
        lines.extend(device_limit_lines(&attr));
        lines.push(dev("num_comp_vectors:", ctx.num_comp_vectors()));
    }
    let gids = if args.verbose {
        ctx.query_gid_table()?
    } else {
        Vec::new()
    };
    for p in ports {
        lines.extend(port_lines(&ctx, p, &gids, args.verbose)?);
    }
    Ok(lines)
}

/// The `-v` part of a device: limits, capability flags, and the extended capabilities.
fn device_limit_lines(attr: &DeviceAttr) -> Vec<String> {
    let raw = attr.as_raw();
    let classic_flags = u64::from(raw.orig_attr.device_cap_flags);
    let mut lines = vec![
        dev("max_mr_size:", format_args!("{:#x}", attr.max_mr_size())),
        dev(
            "page_size_cap:",
            format_args!("{:#x}", attr.page_size_cap()),
        ),
        dev("max_qp:", attr.max_qp()),
        dev("max_qp_wr:", attr.max_qp_wr()),
        dev("device_cap_flags:", format_args!("{classic_flags:#010x}")),
    ];
    lines.extend(flag_lines(
        classic_flags,
        &text::device_cap_flag_names(),
        false,
    ));
    for (label, value) in [
        ("max_sge:", attr.max_sge()),
        ("max_sge_rd:", attr.max_sge_rd()),
        ("max_cq:", attr.max_cq()),
        ("max_cqe:", attr.max_cqe()),
        ("max_mr:", attr.max_mr()),
        ("max_pd:", attr.max_pd()),
        ("max_qp_rd_atom:", attr.max_qp_rd_atom()),
        ("max_ee_rd_atom:", attr.max_ee_rd_atom()),
        ("max_res_rd_atom:", attr.max_res_rd_atom()),
        ("max_qp_init_rd_atom:", attr.max_qp_init_rd_atom()),
        ("max_ee_init_rd_atom:", attr.max_ee_init_rd_atom()),
    ] {
        lines.push(dev(label, value));
    }
    lines.push(dev("atomic_cap:", text::atomic_cap(attr.atomic_cap())));
    for (label, value) in [
        ("max_ee:", attr.max_ee()),
        ("max_rdd:", attr.max_rdd()),
        ("max_mw:", attr.max_mw()),
        ("max_raw_ipv6_qp:", attr.max_raw_ipv6_qp()),
        ("max_raw_ethy_qp:", attr.max_raw_ethy_qp()),
        ("max_mcast_grp:", attr.max_mcast_grp()),
        ("max_mcast_qp_attach:", attr.max_mcast_qp_attach()),
        (
            "max_total_mcast_qp_attach:",
            attr.max_total_mcast_qp_attach(),
        ),
        ("max_ah:", attr.max_ah()),
        ("max_fmr:", attr.max_fmr()),
    ] {
        lines.push(dev(label, value));
    }
    if attr.max_fmr() > 0 {
        lines.push(dev("max_map_per_fmr:", attr.max_map_per_fmr()));
    }
    lines.push(dev("max_srq:", attr.max_srq()));
    if attr.max_srq() > 0 {
        lines.push(dev("max_srq_wr:", attr.max_srq_wr()));
        lines.push(dev("max_srq_sge:", attr.max_srq_sge()));
    }
    lines.push(dev("max_pkeys:", attr.max_pkeys()));
    lines.push(dev("local_ca_ack_delay:", attr.local_ca_ack_delay()));

    let odp = attr.odp_caps();
    lines.push("\tgeneral_odp_caps:".to_owned());
    lines.extend(flag_lines(odp.general.bits(), ODP_GENERAL_NAMES, false));
    for (label, caps) in [
        ("rc_odp_caps:", odp.rc),
        ("uc_odp_caps:", odp.uc),
        ("ud_odp_caps:", odp.ud),
        ("xrc_odp_caps:", odp.xrc),
    ] {
        lines.push(format!("\t{label}"));
        lines.extend(flag_lines(
            u64::from(caps.bits()),
            ODP_TRANSPORT_NAMES,
            true,
        ));
    }

    match attr.completion_timestamp_mask() {
        0 => lines.push("\tcompletion_timestamp_mask not supported".to_owned()),
        // rdma-core's words and tabs exactly: a space in the label, three tabs after it
        // (one column further than the other fields).
        mask => lines.push(format!("\tcompletion timestamp_mask:\t\t\t{mask:#018x}")),
    }
    match attr.hca_core_clock() {
        0 => lines.push("\tcore clock not supported".to_owned()),
        khz => lines.push(dev("hca_core_clock:", format_args!("{khz}kHZ"))),
    }

    let flags_ex = raw.device_cap_flags_ex;
    lines.push(dev("device_cap_flags_ex:", format_args!("{flags_ex:#X}")));
    // The low 32 bits repeat device_cap_flags, already named above.
    lines.extend(flag_lines(
        flags_ex & !u64::from(u32::MAX),
        DEVICE_CAP_FLAGS_EX_NAMES,
        false,
    ));

    let tso = raw.tso_caps;
    lines.push("\ttso_caps:".to_owned());
    lines.push(field(2, "max_tso:", tso.max_tso, PORT_COLUMN));
    if tso.max_tso > 0 {
        lines.push("\t\tsupported_qp:".to_owned());
        lines.extend(flag_lines(
            u64::from(tso.supported_qpts),
            QP_TYPE_NAMES,
            false,
        ));
    }

    let rss = raw.rss_caps;
    lines.push("\trss_caps:".to_owned());
    lines.push(field(
        2,
        "max_rwq_indirection_tables:",
        rss.max_rwq_indirection_tables,
        RSS_COLUMN,
    ));
    lines.push(field(
        2,
        "max_rwq_indirection_table_size:",
        rss.max_rwq_indirection_table_size,
        RSS_COLUMN,
    ));
    lines.push(field(
        2,
        "rx_hash_function:",
        format_args!("{:#x}", rss.rx_hash_function),
        RSS_COLUMN,
    ));
    lines.push(field(
        2,
        "rx_hash_fields_mask:",
        format_args!("{:#x}", rss.rx_hash_fields_mask),
        RSS_COLUMN,
    ));
    if rss.supported_qpts != 0 {
        lines.push("\t\tsupported_qp:".to_owned());
        lines.extend(flag_lines(
            u64::from(rss.supported_qpts),
            QP_TYPE_NAMES,
            false,
        ));
    }
    lines.push(dev("max_wq_type_rq:", raw.max_wq_type_rq));

    let pacing = raw.packet_pacing_caps;
    lines.push("\tpacket_pacing_caps:".to_owned());
    let kbps = |v: u32| format!("{v}kbps");
    lines.push(field(
        2,
        "qp_rate_limit_min:",
        kbps(pacing.qp_rate_limit_min),
        DEVICE_COLUMN,
    ));
    lines.push(field(
        2,
        "qp_rate_limit_max:",
        kbps(pacing.qp_rate_limit_max),
        DEVICE_COLUMN,
    ));
    if pacing.qp_rate_limit_max > 0 {
        lines.push("\t\tsupported_qp:".to_owned());
        lines.extend(flag_lines(
            u64::from(pacing.supported_qpts),
            QP_TYPE_NAMES,
            false,
        ));
    }

    let tm = raw.tm_caps;
    if tm.max_num_tags == 0 {
        lines.push("\ttag matching not supported".to_owned());
    } else {
        lines.push("\ttag_matching_caps:".to_owned());
        for (label, value) in [
            ("max_rndv_hdr_size:", tm.max_rndv_hdr_size),
            ("max_num_tags:", tm.max_num_tags),
            ("max_ops:", tm.max_ops),
            ("max_sge:", tm.max_sge),
            ("flags:", tm.flags),
        ] {
            lines.push(field(2, label, value, DEVICE_COLUMN));
        }
    }

    let cq_mod = raw.cq_mod_caps;
    if cq_mod.max_cq_count > 0 {
        lines.push("\tcq moderation caps:".to_owned());
        lines.push(field(
            2,
            "max_cq_count:",
            cq_mod.max_cq_count,
            DEVICE_COLUMN,
        ));
        lines.push(field(
            2,
            "max_cq_period:",
            format_args!("{} us", cq_mod.max_cq_period),
            DEVICE_COLUMN,
        ));
    }
    if attr.max_dm_size() > 0 {
        lines.push(dev("maximum available device memory:", attr.max_dm_size()));
    }
    let pci = attr.pci_atomic_caps();
    if pci.fetch_add | pci.swap | pci.compare_swap != 0 {
        lines.push("\tpci_atomic_caps (operand size masks):".to_owned());
        lines.push(field(
            2,
            "fetch_add:",
            format_args!("{:#x}", pci.fetch_add),
            40,
        ));
        lines.push(field(
            2,
            "swap:",
            format_args!("{:#x}", pci.swap),
            DEVICE_COLUMN,
        ));
        lines.push(field(
            2,
            "compare_swap:",
            format_args!("{:#x}", pci.compare_swap),
            DEVICE_COLUMN,
        ));
    }
    lines
}

/// One port: its state, MTUs and addresses, and with `verbose` every attribute and GID. Ends
/// with an empty line.
fn port_lines(
    ctx: &DeviceContext,
    port_num: u8,
    gids: &[GidEntry],
    verbose: bool,
) -> Result<Vec<String>, CliError> {
    let attr: PortAttr = ctx.query_port(port_num)?;
    let mut lines = vec![
        format!("\t\tport:\t{port_num}"),
        port("state:", text::port_state(attr.state())),
        port("max_mtu:", text::mtu(attr.max_mtu())),
        port("active_mtu:", text::mtu(attr.active_mtu())),
        port("sm_lid:", attr.sm_lid()),
        port("port_lid:", attr.lid()),
        port("port_lmc:", format_args!("{:#04x}", attr.lmc())),
        port("link_layer:", text::link_layer(attr.link_layer())),
    ];
    if verbose {
        lines.extend([
            port("max_msg_sz:", format_args!("{:#x}", attr.max_msg_sz())),
            port(
                "port_cap_flags:",
                format_args!("{:#010x}", attr.port_cap_flags()),
            ),
            port(
                "port_cap_flags2:",
                format_args!("{:#06x}", attr.port_cap_flags2()),
            ),
            port("max_vl_num:", text::vl_count(attr.max_vl_num())),
            port(
                "bad_pkey_cntr:",
                format_args!("{:#x}", attr.bad_pkey_cntr()),
            ),
            port(
                "qkey_viol_cntr:",
                format_args!("{:#x}", attr.qkey_viol_cntr()),
            ),
            port("sm_sl:", attr.sm_sl()),
            port("pkey_tbl_len:", attr.pkey_table_len()),
            port("gid_tbl_len:", attr.gid_table_len()),
            port("subnet_timeout:", attr.subnet_timeout()),
            port("init_type_reply:", attr.init_type_reply()),
            port("active_width:", text::width(attr.active_width())),
            port("active_speed:", text::speed(attr.active_speed())),
            port("phys_state:", text::phys_state(attr.phys_state())),
        ]);
        let mut port_gids: Vec<&GidEntry> = gids
            .iter()
            .filter(|g| g.port == port_num && !g.gid.is_zero())
            .collect();
        port_gids.sort_by_key(|g| g.index);
        for g in port_gids {
            lines.push(port(
                &format!("GID[{:3}]:", g.index),
                text::gid_value(g, attr.link_layer()),
            ));
        }
    }
    lines.push(String::new());
    Ok(lines)
}

fn main() -> ExitCode {
    log_to_stderr("ibv_devinfo");
    let args = Args::parse();
    exit_status("ibv_devinfo", run(&args))
}
