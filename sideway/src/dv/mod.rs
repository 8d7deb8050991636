//! Providers' direct verbs: the plugin layer, and one module per provider.
//!
//! rdma-core's providers export functions of their own beside the common verbs (mlx5's
//! `mlx5dv_*` in `libmlx5.so.1`, efa's `efadv_*` in `libefa.so.1`, ...), for what only their
//! hardware does: mlx5's Dynamically Connected (DC) transport, efa's SRD. Like libibverbs, each
//! provider library is loaded at run time by the shim (`rdma-core-mummy-sys`), only when its
//! functions are first used, so nothing links it at build time and a program runs where it is
//! missing.
//!
//! This module is what every provider module shares:
//! - [`Provider`]: what a provider module implements (its name, the shim library holding its
//!   functions, whether a device is one of its devices); [`PROVIDERS`] lists the ones built in
//!   and [`provider_of`] tells which one a device context belongs to.
//! - [`require`]: the check every provider call starts with, turning "library missing" and
//!   "this device is another provider's" into a typed [`DvError`] that names the device, its
//!   driver and what to install or use instead.
//!
//! A new provider (efa's SRD, bnxt_re's) is a new module here: a `Provider` impl, an entry
//! in [`PROVIDERS`], and its functions, each starting with `require::<ThatProvider>`; on the
//! shim's side, one more library in `rdma-core-mummy` (its export list and header).
//!
//! Provider modules:
//! - [`mlx5`] (cargo feature `mlx5`, on by default): `mlx5dv_is_supported`,
//!   `mlx5dv_query_device`, DC transport (DCT targets, DCI initiators and
//!   `mlx5dv_wr_set_dc_addr`) and the `mlx5dv_qp_ex` handle.

use std::fmt;
use std::io;
use std::path::Path;

use rdma_mummy_sys::{Library, LoadError};

use crate::verbs::device::DeviceContext;

#[cfg(feature = "mlx5")]
#[allow(unsafe_code)]
pub mod mlx5;

/// A provider's direct verbs, as a module of [`dv`](self) implements them.
pub trait Provider {
    /// The provider's name, as rdma-core calls it (`"mlx5"`).
    const NAME: &'static str;
    /// The shim library holding the provider's functions.
    const LIBRARY: Library;

    /// Whether `ctx` is a device of this provider, by the provider's own check
    /// (`mlx5dv_is_supported`); false when the provider's library does not load.
    fn is_supported(ctx: &DeviceContext) -> bool;
}

/// One built-in provider, for code that does not know which it wants ([`provider_of`]).
#[derive(Clone, Copy)]
pub struct ProviderEntry {
    /// [`Provider::NAME`].
    pub name: &'static str,
    /// [`Provider::LIBRARY`].
    pub library: Library,
    is_supported: fn(&DeviceContext) -> bool,
}

impl ProviderEntry {
    /// The entry of provider `P`.
    pub const fn of<P: Provider>() -> ProviderEntry {
        ProviderEntry {
            name: P::NAME,
            library: P::LIBRARY,
            is_supported: P::is_supported,
        }
    }

    /// [`Provider::is_supported`].
    pub fn is_supported(&self, ctx: &DeviceContext) -> bool {
        (self.is_supported)(ctx)
    }

    /// Whether the provider's library loads, and why not (`Library::load`): the outcome of
    /// the process's one attempt.
    pub fn load_status(&self) -> Result<(), LoadError> {
        self.library.load()
    }
}

impl fmt::Debug for ProviderEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProviderEntry")
            .field("name", &self.name)
            .field("library", &self.library)
            .finish_non_exhaustive()
    }
}

/// The providers this build of sideway has direct verbs for (by cargo feature).
pub const PROVIDERS: &[ProviderEntry] = &[
    #[cfg(feature = "mlx5")]
    ProviderEntry::of::<mlx5::Mlx5>(),
];

/// The built-in provider whose device `ctx` is, if any (asks each in [`PROVIDERS`]).
pub fn provider_of(ctx: &DeviceContext) -> Option<&'static ProviderEntry> {
    PROVIDERS.iter().find(|p| p.is_supported(ctx))
}

/// Why a direct-verbs call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DvError {
    /// The provider's library could not be loaded; the source says what to install.
    #[error("{device}: {provider} direct verbs are unavailable: {source}")]
    LibraryMissing {
        /// The device's name.
        device: String,
        /// The provider (`mlx5`).
        provider: &'static str,
        /// The loader's error, naming the file, the reason and the package.
        #[source]
        source: LoadError,
    },
    /// The device belongs to another provider.
    #[error(
        "{device} is a{} {driver} device, not {provider}: {need}",
        article(driver)
    )]
    WrongProvider {
        /// The device's name.
        device: String,
        /// Its kernel driver or provider, as [`driver_name`] tells it (`rxe`, `mlx4`, ...);
        /// `unrecognised` when that guess names the very provider whose check said no.
        driver: String,
        /// The provider the call needs.
        provider: &'static str,
        /// What the call needs, in words ("DC transport needs an mlx5 NIC").
        need: &'static str,
    },
    /// The arguments cannot work, whatever the device.
    #[error("{0}")]
    InvalidArgument(String),
    /// A provider verb failed.
    #[error("{call} failed on {device}: {source}")]
    Verb {
        /// The C function (`mlx5dv_create_qp`).
        call: &'static str,
        /// The device's name.
        device: String,
        /// The errno.
        #[source]
        source: io::Error,
    },
    /// Creating a queue pair failed before the provider was asked (a missing CQ, say).
    #[error(transparent)]
    QueuePair(#[from] crate::verbs::queue_pair::QueuePairError),
}

fn article(word: &str) -> &'static str {
    match word.chars().next() {
        Some('a' | 'e' | 'i' | 'o' | 'u' | 'A' | 'E' | 'I' | 'O' | 'U') => "n",
        _ => "",
    }
}

/// Checks that provider `P` can serve `ctx`: its library loads and the device is one of its
/// own. `need` says in words what the caller needs the provider for, for the error.
pub fn require<P: Provider>(ctx: &DeviceContext, need: &'static str) -> Result<(), DvError> {
    if let Err(source) = P::LIBRARY.load() {
        return Err(DvError::LibraryMissing {
            device: ctx.name().to_owned(),
            provider: P::NAME,
            source,
        });
    }
    if P::is_supported(ctx) {
        return Ok(());
    }
    let mut driver = driver_name(ctx);
    if driver == P::NAME {
        // Only a guess from the name said so; the provider's own check said no.
        driver = "unrecognised".to_owned();
    }
    Err(DvError::WrongProvider {
        device: ctx.name().to_owned(),
        driver,
        provider: P::NAME,
        need,
    })
}

/// The kernel driver of `ctx`'s device, for messages: the name of the driver bound to the
/// device under `/sys/class/infiniband/<name>/device/driver` (`mlx5_core` reads `mlx5`),
/// else, for software devices that have none (rxe, siw), the device name without its
/// trailing digits (`rxe0` reads `rxe`). A description, never a decision: which provider
/// a device belongs to is the provider's own check ([`Provider::is_supported`]).
pub fn driver_name(ctx: &DeviceContext) -> String {
    driver_from(Path::new("/sys/class/infiniband"), ctx.name())
}

fn driver_from(sysfs: &Path, device: &str) -> String {
    let bound = std::fs::read_link(sysfs.join(device).join("device").join("driver"))
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()));
    match bound.as_deref() {
        Some("mlx5_core") => "mlx5".to_owned(),
        Some("mlx4_core") => "mlx4".to_owned(),
        Some("bnxt_en") => "bnxt_re".to_owned(),
        Some(other) => other.to_owned(),
        None => {
            let stem = device.trim_end_matches(|c: char| c.is_ascii_digit());
            let stem = stem.trim_end_matches('_');
            if stem.is_empty() {
                "unknown".to_owned()
            } else {
                stem.to_owned()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg_attr(miri, ignore = "reads links, which Miri isolates")]
    fn a_device_without_a_bound_driver_is_named_by_its_stem() {
        let none = Path::new("/nonexistent-sysfs");
        assert_eq!(driver_from(none, "rxe0"), "rxe");
        assert_eq!(driver_from(none, "siw_eth1"), "siw_eth");
        assert_eq!(driver_from(none, "mlx5_0"), "mlx5");
        assert_eq!(driver_from(none, "7"), "unknown");
    }

    #[test]
    #[cfg_attr(miri, ignore = "makes directories and links, which Miri isolates")]
    fn a_bound_driver_is_read_from_sysfs() {
        let dir = std::env::temp_dir().join(format!("sideway-dv-sysfs-{}", std::process::id()));
        let dev = dir.join("mlx5_3").join("device");
        std::fs::create_dir_all(&dev).unwrap();
        let _ = std::fs::remove_file(dev.join("driver"));
        std::os::unix::fs::symlink("../../bus/pci/drivers/mlx5_core", dev.join("driver")).unwrap();
        assert_eq!(driver_from(&dir, "mlx5_3"), "mlx5");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_wrong_provider_error_names_device_driver_and_need() {
        let err = DvError::WrongProvider {
            device: "rxe0".into(),
            driver: "rxe".into(),
            provider: "mlx5",
            need: "DC transport needs an mlx5 NIC",
        };
        assert_eq!(
            err.to_string(),
            "rxe0 is a rxe device, not mlx5: DC transport needs an mlx5 NIC"
        );
        let err = DvError::WrongProvider {
            device: "efa_0".into(),
            driver: "efa".into(),
            provider: "mlx5",
            need: "x",
        };
        assert!(err.to_string().starts_with("efa_0 is an efa device"));
    }
}
