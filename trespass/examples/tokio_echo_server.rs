//! Echo server on tokio: a task per connection, all on the runtime's threads (no thread
//! per connection), each echoing until end of stream.
//!
//! `cargo run -p trespass --example tokio_echo_server -- [ADDR]` (default `198.18.0.1:7471`).

use std::io;

#[tokio::main]
async fn main() -> io::Result<()> {
    let addr = std::env::args().nth(1);
    let addr = addr.unwrap_or_else(|| "198.18.0.1:7471".into());
    let listener = trespass::tokio::Listener::bind(addr).await?;
    println!("echoing on {}", listener.local_addr()?);
    loop {
        let (mut stream, peer) = listener.accept().await?;
        tokio::spawn(async move {
            let (mut rd, mut wr) = tokio::io::split(&mut stream);
            match tokio::io::copy(&mut rd, &mut wr).await {
                // End of stream: dropping the stream closes this side too.
                Ok(n) => println!("{peer}: echoed {n} bytes"),
                Err(e) => eprintln!("{peer}: {e}"),
            }
        });
    }
}
