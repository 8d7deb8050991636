//! Echo client on tokio: sends a message, shuts its write side down, reads the echo to end
//! of stream and checks it.
//!
//! `cargo run -p trespass --example tokio_echo_client -- [ADDR] [MESSAGE]`
//! (defaults `198.18.0.1:7471` and `hello over RDMA`).

use std::io;
use std::process::ExitCode;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

async fn echo(addr: String, message: &str) -> io::Result<Vec<u8>> {
    let mut stream = trespass::tokio::Stream::connect(addr).await?;
    stream.write_all(message.as_bytes()).await?;
    stream.shutdown().await?;
    let mut reply = Vec::new();
    stream.read_to_end(&mut reply).await?;
    Ok(reply)
}

#[tokio::main]
async fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let addr = args.next().unwrap_or_else(|| "198.18.0.1:7471".into());
    let message = args.next().unwrap_or_else(|| "hello over RDMA".into());
    match echo(addr, &message).await {
        Ok(reply) if reply == message.as_bytes() => {
            println!("{}", String::from_utf8_lossy(&reply));
            ExitCode::SUCCESS
        }
        Ok(reply) => {
            let got = String::from_utf8_lossy(&reply);
            eprintln!("tokio_echo_client: the echo differs: sent {message:?}, got {got:?}");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("tokio_echo_client: {e}");
            ExitCode::FAILURE
        }
    }
}
