//! `show_gids`: every GID of every RDMA port, one row each, with its IPv4 address, RoCE
//! version and network device, as the classic `show_gids` script lists them; the last line
//! says how many there were (`n_gids_found=N`).

use std::io::{self, Write};
use std::process::ExitCode;

use clap::Parser;
use sideway_examples::cli::{exit_status, log_to_stderr, select_devices, CliError};
use sideway_examples::device_text::{columns, gid_version};

/// Lists the GID table of RDMA ports: device, port, index, GID, IPv4 address, RoCE version
/// and network device.
#[derive(Debug, Parser)]
#[command(name = "show_gids", version)]
struct Args {
    /// Only this RDMA device (default: every device)
    #[arg(short = 'd', long = "ib-dev", value_name = "DEVICE")]
    ib_dev: Option<String>,

    /// Only this port, numbered from 1 (default: every port)
    #[arg(short = 'i', long = "ib-port", value_name = "PORT")]
    ib_port: Option<u8>,
}

fn run(args: &Args) -> Result<(), CliError> {
    let header = ["DEV", "PORT", "INDEX", "GID", "IPv4", "VER", "DEV"];
    let mut rows: Vec<Vec<String>> = vec![
        header.iter().map(|h| (*h).to_owned()).collect(),
        header.iter().map(|h| "-".repeat(h.len())).collect(),
    ];
    let mut found = 0usize;
    for device in select_devices(args.ib_dev.as_deref())? {
        let ctx = device.open()?;
        if let Some(port) = args.ib_port {
            // Fails with "DEV has no port N; its ports are 1..=M" for a port that is not there.
            ctx.query_port(port)?;
        }
        let mut entries = ctx.query_gid_table()?;
        let wanted_port = |port: u8| match args.ib_port {
            Some(p) => port == p,
            None => true,
        };
        entries.retain(|e| wanted_port(e.port) && !e.gid.is_zero());
        entries.sort_by_key(|e| (e.port, e.index));
        for e in entries {
            found += 1;
            rows.push(vec![
                ctx.name().to_owned(),
                e.port.to_string(),
                e.index.to_string(),
                e.gid.to_string(),
                e.gid
                    .to_ipv4_mapped()
                    .map(|ip| ip.to_string())
                    .unwrap_or_default(),
                gid_version(e.gid_type),
                e.netdev.clone().unwrap_or_default(),
            ]);
        }
    }
    let mut out = io::stdout().lock();
    for line in columns(&rows) {
        writeln!(out, "{line}")?;
    }
    writeln!(out, "n_gids_found={found}")?;
    out.flush()?;
    Ok(())
}

fn main() -> ExitCode {
    log_to_stderr("show_gids");
    let args = Args::parse();
    exit_status("show_gids", run(&args))
}
