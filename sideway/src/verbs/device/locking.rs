//! The providers' locking mode, which the crate's `Sync` types rely on.
//!
//! libmlx5 drops its CQ, SRQ and doorbell locks when `MLX5_SINGLE_THREADED` is exactly `1` as
//! it opens a context (a process-wide flag, read at every open, that every CQ and SRQ created
//! afterwards inherits). Those locks are what make a QP destroyed on one thread, or an SRQ
//! posted on one thread, safe against its CQ polled on another: the crate's polling claim
//! serialises polls only. So the crate does not open, import or wrap an mlx5 device while the
//! variable says single-threaded; objects that do stay on one thread without locks are what
//! thread domains are for.

use std::ffi::OsStr;
use std::path::Path;

/// The error text for a refused device.
pub(crate) fn refusal(device: &str) -> String {
    format!(
        "{device} is an mlx5 device and MLX5_SINGLE_THREADED=1 is set: libmlx5 would then take \
         none of the CQ and SRQ locks that sideway's Sync types rely on (a QP destroyed or an \
         SRQ posted on one thread while its CQ is polled on another); unset it, and use a \
         thread domain for objects that stay on one thread"
    )
}

/// Whether `device`'s provider would run without locks: the variable's value and the
/// device's kernel driver (its sysfs `device/driver` link) decide.
pub(crate) fn unlocked(device: &str) -> bool {
    unlocked_by(
        std::env::var_os("MLX5_SINGLE_THREADED").as_deref(),
        driver_of(device).as_deref(),
    )
}

/// Where the kernel lists RDMA devices.
const SYSFS_DEVICES: &str = "/sys/class/infiniband";

/// The decision, on its inputs: libmlx5 takes exactly `1`; mlx5 devices are driven by the
/// kernel's `mlx5_core` (their ib devices by `mlx5_ib`, whose sysfs parent is the PCI
/// function `mlx5_core` binds).
fn unlocked_by(env: Option<&OsStr>, driver: Option<&str>) -> bool {
    env == Some(OsStr::new("1")) && driver.is_some_and(|d| d.starts_with("mlx5"))
}

/// The kernel driver bound to `device`'s parent (`mlx5_core`, ...); `None` for a device
/// without one (SoftRoCE's rxe) or without sysfs.
fn driver_of(device: &str) -> Option<String> {
    driver_in(Path::new(SYSFS_DEVICES), device)
}

/// [`driver_of`] under another sysfs root (the tests' own tree).
fn driver_in(root: &Path, device: &str) -> Option<String> {
    let target = std::fs::read_link(root.join(device).join("device/driver")).ok()?;
    Some(target.file_name()?.to_string_lossy().into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_mlx5_with_exactly_one_is_refused() {
        let one = Some(OsStr::new("1"));
        assert!(unlocked_by(one, Some("mlx5_core")));
        // libmlx5 compares with strcmp: anything else keeps the locks.
        for env in ["0", "true", "1 ", "yes", ""] {
            assert!(
                !unlocked_by(Some(OsStr::new(env)), Some("mlx5_core")),
                "{env:?}"
            );
        }
        assert!(!unlocked_by(None, Some("mlx5_core")));
        // Other providers ignore the variable; rxe has no driver link at all.
        assert!(!unlocked_by(one, Some("irdma")));
        assert!(!unlocked_by(one, None));
    }

    #[test]
    #[cfg_attr(miri, ignore = "reads sysfs")]
    fn a_device_that_does_not_exist_has_no_driver() {
        assert_eq!(driver_of("no-such-device-here"), None);
    }

    #[test]
    #[cfg_attr(miri, ignore = "makes a directory tree and symlinks")]
    fn the_driver_is_read_from_the_devices_sysfs_link() {
        // The tree the kernel makes: mlx5_0/device -> the PCI function, whose driver link
        // names mlx5_core; rxe0 has no device link at all.
        let root = std::env::temp_dir().join(format!("sideway-locking-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("mlx5_0/device")).unwrap();
        std::os::unix::fs::symlink(
            "../../../../bus/pci/drivers/mlx5_core",
            root.join("mlx5_0/device/driver"),
        )
        .unwrap();
        std::fs::create_dir_all(root.join("rxe0")).unwrap();
        let mlx5 = driver_in(&root, "mlx5_0");
        let rxe = driver_in(&root, "rxe0");
        std::fs::remove_dir_all(&root).unwrap();
        assert_eq!(mlx5.as_deref(), Some("mlx5_core"));
        assert_eq!(rxe, None);
        let one = Some(OsStr::new("1"));
        assert!(unlocked_by(one, mlx5.as_deref()), "refused");
        assert!(!unlocked_by(one, rxe.as_deref()), "left alone");
    }

    #[test]
    fn the_refusal_says_what_to_do() {
        let msg = refusal("mlx5_0");
        assert!(msg.contains("mlx5_0") && msg.contains("MLX5_SINGLE_THREADED=1"));
        assert!(msg.contains("unset it"));
    }
}
