//! Echo server: echoes each connection back to its client until end of stream, one thread
//! per connection.
//!
//! `cargo run -p trespass --example echo_server -- [ADDR]` (default `198.18.0.1:7471`).

use std::io::{self, Read, Write};
use std::thread;

fn echo(mut stream: trespass::Stream) -> io::Result<u64> {
    let mut buf = vec![0u8; 64 * 1024];
    let mut total = 0;
    loop {
        let n = stream.read(&mut buf)?;
        if n == 0 {
            // End of stream: dropping the stream closes this side too.
            return Ok(total);
        }
        stream.write_all(&buf[..n])?;
        total += n as u64;
    }
}

fn main() -> io::Result<()> {
    let arg = std::env::args().nth(1);
    let addr = arg.as_deref().unwrap_or("198.18.0.1:7471");
    let listener = trespass::Listener::bind(addr)?;
    println!("echoing on {}", listener.local_addr()?);
    loop {
        let (stream, peer) = listener.accept()?;
        thread::spawn(move || match echo(stream) {
            Ok(n) => println!("{peer}: echoed {n} bytes"),
            Err(e) => eprintln!("{peer}: {e}"),
        });
    }
}
