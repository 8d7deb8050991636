//! Enhanced connection establishment (`ibv_set_ece`, `ibv_query_ece`): the vendor options two
//! QPs agree on while connecting, carried in the connection manager's messages or the
//! application's own exchange.

use std::io;

use rdma_mummy_sys as ffi;

use super::qp::{QueuePair, Threading};
use crate::errno::{fresh, from_ret};

/// Enhanced connection establishment options (`struct ibv_ece`).
#[doc(alias = "ibv_ece")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Ece {
    /// The vendor's IEEE OUI, so that devices of different vendors tell their options apart.
    pub vendor_id: u32,
    /// The vendor's options, a bit mask only that vendor defines.
    pub options: u32,
    /// Which further fields are valid; none are defined yet, so 0.
    pub comp_mask: u32,
}

impl Ece {
    fn to_raw(self) -> ffi::ibv_ece {
        ffi::ibv_ece {
            vendor_id: self.vendor_id,
            options: self.options,
            comp_mask: self.comp_mask,
        }
    }

    fn from_raw(raw: &ffi::ibv_ece) -> Self {
        Ece {
            vendor_id: raw.vendor_id,
            options: raw.options,
            comp_mask: raw.comp_mask,
        }
    }
}

/// `ibv_query_ece` or `ibv_set_ece` failed; `EOPNOTSUPP` when the device has no ECE.
#[derive(Debug, thiserror::Error)]
#[error(
    "{call} on QP {qp_num:#x} failed on {device}: {source}{}",
    ece_hint(source)
)]
pub struct EceError {
    /// `ibv_query_ece` or `ibv_set_ece`.
    pub call: &'static str,
    /// The device's name.
    pub device: String,
    /// The QP number.
    pub qp_num: u32,
    /// The errno.
    #[source]
    pub source: io::Error,
}

fn ece_hint(source: &io::Error) -> &'static str {
    match source.raw_os_error() {
        Some(libc::EOPNOTSUPP) => {
            " (not supported by this device: its provider has no enhanced connection \
             establishment; mlx5 has it, rxe and siw do not)"
        }
        _ => "",
    }
}

impl EceError {
    /// True when the device has no ECE (`EOPNOTSUPP`): connect without it.
    pub fn is_not_supported(&self) -> bool {
        self.source.raw_os_error() == Some(libc::EOPNOTSUPP)
    }
}

impl<T: Threading> QueuePair<T> {
    /// The ECE options the QP uses (`ibv_query_ece`): before the connection, the device's
    /// own; once the QP is past RTR, what the two sides agreed on.
    #[doc(alias = "ibv_query_ece")]
    pub fn query_ece(&self) -> Result<Ece, EceError> {
        let mut raw = Ece::default().to_raw();
        // SAFETY: the QP is alive for as long as self; raw is a valid out-parameter.
        let ret = fresh(|| unsafe { ffi::ibv_query_ece(self.as_raw(), &mut raw) });
        from_ret(ret).map_err(|source| self.ece_error("ibv_query_ece", source))?;
        Ok(Ece::from_raw(&raw))
    }

    /// Sets the ECE options the QP offers (`ibv_set_ece`): on the passive side, the options
    /// the peer sent, before the QP moves to RTR; on the active side, before it moves to
    /// INIT or RTR, as the provider's man page says.
    #[doc(alias = "ibv_set_ece")]
    pub fn set_ece(&self, ece: Ece) -> Result<(), EceError> {
        let mut raw = ece.to_raw();
        // SAFETY: the QP is alive for as long as self; raw is a valid, initialised struct
        // the verb only reads.
        let ret = fresh(|| unsafe { ffi::ibv_set_ece(self.as_raw(), &mut raw) });
        from_ret(ret).map_err(|source| self.ece_error("ibv_set_ece", source))
    }

    fn ece_error(&self, call: &'static str, source: io::Error) -> EceError {
        EceError {
            call,
            device: self.pd().context().name().to_owned(),
            qp_num: self.qp_num(),
            source,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ece_round_trips_through_the_c_struct() {
        let ece = Ece {
            vendor_id: 0x02c9,
            options: 0x1000_0001,
            comp_mask: 0,
        };
        assert_eq!(Ece::from_raw(&ece.to_raw()), ece);
        assert_eq!(std::mem::size_of::<ffi::ibv_ece>(), 12);
    }

    #[test]
    fn not_supported_says_so() {
        let e = EceError {
            call: "ibv_query_ece",
            device: "rxe0".into(),
            qp_num: 0x11,
            source: io::Error::from_raw_os_error(libc::EOPNOTSUPP),
        };
        assert!(e.is_not_supported());
        let text = e.to_string();
        assert!(
            text.starts_with("ibv_query_ece on QP 0x11 failed on rxe0: "),
            "{text}"
        );
        assert!(text.contains("not supported by this device"), "{text}");
    }
}
