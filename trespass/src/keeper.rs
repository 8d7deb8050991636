//! The keep-alive helper: one process-wide thread that, every [`TICK`], pumps each
//! connection that no thread is using at that moment (its lock is free), keep-alive on or not,
//! so that probes are answered, credits returned and a dead peer noticed while the
//! application is busy elsewhere. When a pump made progress it pokes the connection's
//! readiness fd, so a poll/epoll user wakes up and calls in.

use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use crate::stream::Shared;

/// How often the helper looks at each connection.
pub(crate) const TICK: Duration = Duration::from_millis(100);

fn registry() -> &'static Mutex<Vec<Weak<Shared>>> {
    static REGISTRY: OnceLock<Mutex<Vec<Weak<Shared>>>> = OnceLock::new();
    REGISTRY.get_or_init(|| {
        let spawned = std::thread::Builder::new()
            .name("trespass-keepalive".into())
            .spawn(run);
        if let Err(e) = spawned {
            log::error!(target: "trespass", "cannot start the keep-alive thread: {e}; probes are answered only during calls");
        }
        Mutex::new(Vec::new())
    })
}

/// Looks after `shared` from now on, until it is dropped.
pub(crate) fn register(shared: &Arc<Shared>) {
    let mut list = registry().lock().unwrap_or_else(|p| p.into_inner());
    list.push(Arc::downgrade(shared));
}

fn run() {
    crate::signals::leave_signals_to_the_application();
    // Room for the connections of a pass, made once: a pass allocates nothing until a
    // process has more connections than ever before.
    let mut live: Vec<Arc<Shared>> = Vec::with_capacity(64);
    loop {
        std::thread::sleep(TICK);
        {
            let mut list = registry().lock().unwrap_or_else(|p| p.into_inner());
            list.retain(|w| match w.upgrade() {
                Some(s) => {
                    live.push(s);
                    true
                }
                None => false,
            });
        }
        let now = Instant::now();
        for shared in live.drain(..) {
            let Ok(mut driver) = shared.driver.try_lock() else {
                continue;
            };
            if driver.pump(now) {
                shared.readiness.notify();
            }
        }
    }
}
