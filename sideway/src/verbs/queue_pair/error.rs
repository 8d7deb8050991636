//! The queue pair's errors: creating it, modifying and querying it, connecting two.

use std::fmt;
use std::io;

use super::attr::{QpAttrMask, QpCapabilities, QpState, QpType};
use super::state_table::MaskDiagnosis;

/// Why a queue pair could not be created.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum QueuePairError {
    /// The builder was not given a completion queue.
    #[error("a queue pair needs a {which} completion queue: call {which}_cq() on the builder")]
    MissingCq {
        /// `send` or `recv`.
        which: &'static str,
    },
    /// The builder's PD is a parent domain bound to a thread domain, whose queue pairs must
    /// be `QueuePair<OneThread>`: make them with `ParentDomain::create_qp_builder`.
    #[error(
        "the PD is a parent domain bound to a thread domain on {device}: make its queue pairs \
         with ParentDomain::create_qp_builder (QueuePair<OneThread>)"
    )]
    ThreadBoundPd {
        /// The device's name.
        device: String,
    },
    /// An XRC receive QP belongs to an XRC domain, not a PD.
    #[error("an XRC receive QP is made on an XRC domain, not a PD: use XrcDomain::create_recv_qp")]
    XrcRecvOnPd,
    /// The create verb failed.
    #[error(
        "{call} of an {qp_type} QP with {cap:?} failed on {device}: {source}{}",
        create_hint(source, call)
    )]
    Create {
        /// `ibv_create_qp`, `ibv_create_qp_ex` or `ibv_qp_to_qp_ex`.
        call: &'static str,
        /// The device's name.
        device: String,
        /// The QP type asked for.
        qp_type: QpType,
        /// The sizes asked for.
        cap: QpCapabilities,
        /// The errno.
        source: io::Error,
    },
}

fn create_hint(source: &io::Error, call: &str) -> &'static str {
    match source.raw_os_error() {
        Some(libc::EOPNOTSUPP) if call == "ibv_create_qp_ex (XRC)" => {
            " (not supported by this device: its provider has no XRC)"
        }
        Some(libc::EOPNOTSUPP) if call != "ibv_create_qp" => {
            " (this device has no extended QPs, or not with these send_ops_flags: use build())"
        }
        Some(libc::EINVAL) => {
            " (more work requests, SGEs or inline bytes than the device allows? see query_device())"
        }
        Some(libc::ENOMEM) => " (out of memory, or the locked-memory limit `ulimit -l` is too low)",
        _ => "",
    }
}

/// Why `ibv_modify_qp` failed, with the transition and (for `EINVAL`) what the IB spec's
/// state table says is wrong with the attribute mask.
#[derive(Debug)]
pub struct ModifyQpError {
    /// The QP number.
    pub qp_num: u32,
    /// The QP type.
    pub qp_type: QpType,
    /// The state the QP was in.
    pub from: QpState,
    /// The state asked for (`from` when the mask had no `STATE` bit).
    pub to: QpState,
    /// The attribute mask passed.
    pub mask: QpAttrMask,
    /// The state table's verdict on the mask; computed only for `EINVAL`.
    pub diagnosis: Option<MaskDiagnosis>,
    /// The errno.
    pub source: io::Error,
}

/// The symbolic name of common error numbers, for messages.
fn errno_name(errno: Option<i32>) -> &'static str {
    match errno {
        Some(libc::EINVAL) => "EINVAL",
        Some(libc::ENOMEM) => "ENOMEM",
        Some(libc::EPERM) => "EPERM",
        Some(libc::EACCES) => "EACCES",
        Some(libc::EOPNOTSUPP) => "EOPNOTSUPP",
        Some(libc::EBUSY) => "EBUSY",
        Some(libc::EAGAIN) => "EAGAIN",
        Some(libc::EFAULT) => "EFAULT",
        Some(libc::ENOSYS) => "ENOSYS",
        Some(libc::EIO) => "EIO",
        Some(libc::ENODEV) => "ENODEV",
        Some(libc::ETIMEDOUT) => "ETIMEDOUT",
        Some(libc::ENOENT) => "ENOENT",
        _ => "",
    }
}

impl fmt::Display for ModifyQpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "failed to modify QP {:#x} ", self.qp_num)?;
        if self.mask.contains(QpAttrMask::STATE) {
            write!(f, "from {} to {}", self.from, self.to)?;
        } else {
            write!(f, "in {} (no state change)", self.from)?;
        }
        f.write_str(": ")?;
        match self.diagnosis {
            Some(MaskDiagnosis::NoSuchTransition) => write!(
                f,
                "an {} QP has no transition from {} to {}",
                self.qp_type, self.from, self.to
            )?,
            Some(MaskDiagnosis::Attributes {
                missing,
                not_allowed,
            }) => {
                if !missing.is_empty() {
                    write!(f, "missing attributes {}", missing.names())?;
                }
                if !not_allowed.is_empty() {
                    if !missing.is_empty() {
                        f.write_str("; ")?;
                    }
                    let verb = if not_allowed.bits().count_ones() == 1 {
                        "is"
                    } else {
                        "are"
                    };
                    write!(f, "{} {verb} not allowed here", not_allowed.names())?;
                }
                if missing.is_empty() && not_allowed.is_empty() {
                    write!(
                        f,
                        "the mask ({}) fits the state table, so a value is out of range or \
                         unsupported (port, GID index, MTU, PSN, rd_atomic limits?)",
                        self.mask.names()
                    )?;
                }
            }
            Some(MaskDiagnosis::Unknown) | None => write!(f, "{}", self.source)?,
        }
        if self.diagnosis.is_some() {
            let name = errno_name(self.source.raw_os_error());
            if name.is_empty() {
                write!(f, " ({})", self.source)?;
            } else {
                write!(f, " ({name})")?;
            }
        }
        Ok(())
    }
}

impl std::error::Error for ModifyQpError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

/// `ibv_query_qp` failed.
#[derive(Debug, thiserror::Error)]
#[error("ibv_query_qp of QP {qp_num:#x} for {} failed: {source}", mask.names())]
pub struct QueryQpError {
    /// The QP number.
    pub qp_num: u32,
    /// The attributes asked for.
    pub mask: QpAttrMask,
    /// The errno.
    #[source]
    pub source: io::Error,
}

/// Why [`QueuePair::connect`](super::QueuePair::connect) failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// One of the modify steps failed.
    #[error("connecting QP {qp_num:#x} to QP {remote_qp_num:#x}: step {step} failed: {source}")]
    Step {
        /// The local QP number.
        qp_num: u32,
        /// The peer's QP number.
        remote_qp_num: u32,
        /// Which step: `1/3 (Reset to Init)`, `2/3 (Init to RTR)` or `3/3 (RTR to RTS)`.
        step: &'static str,
        /// The modify error, which names the attributes at fault.
        #[source]
        source: ModifyQpError,
    },
    /// The QP type has no connect sequence here.
    #[error("QP {qp_num:#x} is an {qp_type} QP; connect() handles RC, UC and UD")]
    UnsupportedType {
        /// The local QP number.
        qp_num: u32,
        /// Its type.
        qp_type: QpType,
    },
}
