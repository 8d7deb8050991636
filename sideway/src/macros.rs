//! `c_enum!`: a Rust enum for a C enum whose set of values a newer rdma-core may grow, and
//! [`UnknownValue`], what its `Unknown` arm holds.
//!
//! Every generated enum is `#[non_exhaustive]`, has an `Unknown(UnknownValue<Self>)` arm
//! that keeps any value this crate does not know, converts from the raw value without ever
//! panicking, and converts back losslessly.
//!
//! The crate branches on these enums (a UD QP's sends need an address, an XRC send QP's a
//! remote SRQ), so every value has exactly one spelling: a value the crate knows is always
//! its named variant, never `Unknown`. Only the `From<u32>` conversion makes an
//! `UnknownValue`, and only for a value no named variant has; users can match on it and read
//! it, not build one.

use std::fmt;
use std::hash::{Hash, Hasher};
use std::marker::PhantomData;

/// A raw value of the C enum `E` that this version of the crate has no variant for: what
/// `E::Unknown` holds.
///
/// Never one of the values `E` names: those always convert to their variant. It is made only
/// by `E::from(u32)`, so the way to pass a value this crate does not know (from a newer
/// rdma-core) is `E::from(raw)`, which gives the named variant whenever there is one:
///
/// ```
/// use sideway::queue_pair::QpType;
/// use sideway::sys::ibv_qp_type;
///
/// assert_eq!(QpType::from(ibv_qp_type::IBV_QPT_UD), QpType::Ud);
/// match QpType::from(77) {
///     QpType::Unknown(value) => assert_eq!(value.get(), 77),
///     other => panic!("77 is no QP type this crate knows, yet it gave {other:?}"),
/// }
/// ```
///
/// An `Unknown` holding a known value cannot be written, so no QP, state or opcode can
/// pass for something it is not:
///
/// ```compile_fail,E0308
/// use sideway::queue_pair::QpType;
/// use sideway::sys::ibv_qp_type;
///
/// let disguised_ud = QpType::Unknown(ibv_qp_type::IBV_QPT_UD);
/// ```
///
/// ```compile_fail,E0451
/// use sideway::queue_pair::QpType;
/// use sideway::UnknownValue;
///
/// let disguised_ud = QpType::Unknown(UnknownValue { raw: 4, enum_type: std::marker::PhantomData });
/// ```
///
/// Nor can one enum's unknown value be moved to another, where it may be known:
///
/// ```compile_fail,E0308
/// use sideway::memory_window::MwType;
/// use sideway::queue_pair::QpType;
///
/// if let MwType::Unknown(value) = MwType::from(4) {
///     let disguised_ud = QpType::Unknown(value);
/// }
/// ```
pub struct UnknownValue<E> {
    raw: u32,
    /// Ties the value to its enum; `fn() -> E` keeps `UnknownValue` `Send`, `Sync` and
    /// `Copy` whatever `E` is.
    enum_type: PhantomData<fn() -> E>,
}

impl<E> UnknownValue<E> {
    /// The only constructor, for `c_enum!`'s `From<u32>`, which calls it after `raw` matched
    /// none of `E`'s named values.
    pub(crate) const fn not_named(raw: u32) -> Self {
        UnknownValue {
            raw,
            enum_type: PhantomData,
        }
    }

    /// The raw value, as the C library gave it.
    pub const fn get(self) -> u32 {
        self.raw
    }
}

impl<E> From<UnknownValue<E>> for u32 {
    fn from(value: UnknownValue<E>) -> u32 {
        value.raw
    }
}

// By hand rather than derived: a derive would ask the same of `E`, which only names the enum.
impl<E> Clone for UnknownValue<E> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<E> Copy for UnknownValue<E> {}

impl<E> PartialEq for UnknownValue<E> {
    fn eq(&self, other: &Self) -> bool {
        self.raw == other.raw
    }
}

impl<E> Eq for UnknownValue<E> {}

impl<E> Hash for UnknownValue<E> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.raw.hash(state);
    }
}

/// The number alone, so `E::Unknown(77)` reads as before.
impl<E> fmt::Debug for UnknownValue<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.raw, f)
    }
}

/// The number.
impl<E> fmt::Display for UnknownValue<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.raw, f)
    }
}

macro_rules! c_enum {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident : $c_name:literal {
            $( $(#[$vmeta:meta])* $variant:ident = $value:expr, )*
        }
    ) => {
        $(#[$meta])*
        #[doc = concat!("\n\nMirrors C's `", $c_name, "`; values this crate does not know \
            (from a newer rdma-core) arrive as `Unknown`, and a value it knows always as its \
            named variant.")]
        #[doc(alias = $c_name)]
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[non_exhaustive]
        $vis enum $name {
            $( $(#[$vmeta])* $variant, )*
            /// A value this version of the crate does not know (never one of the values
            /// above); made only by `From<u32>`.
            Unknown($crate::macros::UnknownValue<$name>),
        }

        impl From<u32> for $name {
            fn from(raw: u32) -> Self {
                $( if raw == ($value) as u32 { return $name::$variant; } )*
                $name::Unknown($crate::macros::UnknownValue::not_named(raw))
            }
        }

        impl From<$name> for u32 {
            fn from(value: $name) -> u32 {
                match value {
                    $( $name::$variant => ($value) as u32, )*
                    $name::Unknown(value) => value.get(),
                }
            }
        }

        #[cfg(test)]
        impl $name {
            /// Every named variant with its C value, for the canonical-form tests.
            #[allow(dead_code)]
            pub(crate) const NAMED: &'static [($name, u32)] =
                &[ $( ($name::$variant, ($value) as u32), )* ];
        }
    };
}

pub(crate) use c_enum;

#[cfg(test)]
pub(crate) mod tests {
    use std::fmt::Debug;

    /// Checks that `E` has one spelling per value: each named variant converts to its value
    /// and back to itself, and every other value (the C enum's neighbourhood and the extremes)
    /// arrives as `Unknown` holding that value, which differs from every named variant.
    pub(crate) fn assert_canonical<E>(named: &[(E, u32)], is_unknown: impl Fn(E) -> Option<u32>)
    where
        E: Copy + Debug + PartialEq + From<u32> + Into<u32>,
    {
        for &(variant, raw) in named {
            assert_eq!(E::from(raw), variant, "{raw} is {variant:?}");
            assert_eq!(variant.into(), raw, "{variant:?} is {raw}");
            assert_eq!(is_unknown(variant), None);
        }
        let max = named.iter().map(|&(_, raw)| raw).max().unwrap_or(0);
        let probes = (0..=max.saturating_add(64).min(4096)).chain([
            0xff,
            0x100,
            0xffff,
            u32::MAX / 2,
            u32::MAX - 1,
            u32::MAX,
        ]);
        for raw in probes {
            let value = E::from(raw);
            assert_eq!(value.into(), raw, "{raw} round-trips");
            match named.iter().find(|&&(_, r)| r == raw) {
                Some(&(variant, _)) => assert_eq!(value, variant),
                None => {
                    assert_eq!(is_unknown(value), Some(raw), "{raw} is Unknown({raw})");
                    assert!(named.iter().all(|&(variant, _)| variant != value));
                }
            }
        }
    }

    /// Every C enum the crate mirrors keeps one spelling per value.
    #[test]
    fn every_c_enum_is_canonical() {
        macro_rules! check {
            ($($ty:ident),* $(,)?) => {$(
                assert_canonical::<$ty>($ty::NAMED, |value| match value {
                    $ty::Unknown(unknown) => Some(unknown.get()),
                    _ => None,
                });
            )*};
        }
        use crate::device::{
            AtomicCap, GidType, LinkLayer, Mtu, NodeType, PortSpeed, PortState, PortWidth,
            TransportType,
        };
        use crate::queue_pair::MigState;
        use crate::rdmacm::{EventType, IbRejectReason};
        use crate::work_completion::{WcOpcode, WcStatus};
        use crate::{
            async_event::AsyncEventKind, memory_window::MwType, queue_pair::QpState,
            queue_pair::QpType,
        };
        check!(
            WcStatus,
            WcOpcode,
            EventType,
            IbRejectReason,
            AsyncEventKind,
            MwType,
            AtomicCap,
            TransportType,
            NodeType,
            GidType,
            PortState,
            Mtu,
            LinkLayer,
            PortWidth,
            PortSpeed,
            QpState,
            QpType,
            MigState,
        );
    }

    /// The value the review found disguised: a UD QP's type, which once could be written
    /// `QpType::Unknown(IBV_QPT_UD)` and then posted as a connected QP's.
    #[test]
    fn a_known_qp_type_never_arrives_as_unknown() {
        use crate::queue_pair::QpType;
        use crate::sys::ibv_qp_type as t;
        assert_eq!(QpType::from(t::IBV_QPT_UD), QpType::Ud);
        assert_eq!(QpType::from(t::IBV_QPT_XRC_SEND), QpType::XrcSend);
        assert!(matches!(QpType::from(77), QpType::Unknown(v) if v.get() == 77));
        assert_eq!(format!("{:?}", QpType::from(77)), "Unknown(77)");
    }
}
