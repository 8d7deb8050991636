//! Echo client: sends a message, shuts its write side down, reads the echo to end of stream
//! and checks it.
//!
//! `cargo run -p trespass --example echo_client -- [ADDR] [MESSAGE]`
//! (defaults `198.18.0.1:7471` and `hello over RDMA`).

use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::process::ExitCode;

fn echo(addr: &str, message: &str) -> io::Result<Vec<u8>> {
    let mut stream = trespass::Stream::connect(addr)?;
    stream.write_all(message.as_bytes())?;
    stream.shutdown(Shutdown::Write)?;
    let mut reply = Vec::new();
    stream.read_to_end(&mut reply)?;
    Ok(reply)
}

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let addr = args.next().unwrap_or_else(|| "198.18.0.1:7471".into());
    let message = args.next().unwrap_or_else(|| "hello over RDMA".into());
    match echo(&addr, &message) {
        Ok(reply) if reply == message.as_bytes() => {
            println!("{}", String::from_utf8_lossy(&reply));
            ExitCode::SUCCESS
        }
        Ok(reply) => {
            let got = String::from_utf8_lossy(&reply);
            eprintln!("echo_client: the echo differs: sent {message:?}, got {got:?}");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("echo_client: {e}");
            ExitCode::FAILURE
        }
    }
}
