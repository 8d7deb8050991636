//! `c_enum!`: a Rust enum for a C enum whose set of values a newer rdma-core may grow.
//!
//! Every generated enum is `#[non_exhaustive]`, has an `Unknown(u32)` arm that keeps any
//! value this crate does not know, converts from the raw value without ever panicking, and
//! converts back losslessly.

macro_rules! c_enum {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident : $c_name:literal {
            $( $(#[$vmeta:meta])* $variant:ident = $value:expr, )*
        }
    ) => {
        $(#[$meta])*
        #[doc = concat!("\n\nMirrors C's `", $c_name, "`; values this crate does not know \
            (from a newer rdma-core) arrive as `Unknown`.")]
        #[doc(alias = $c_name)]
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[non_exhaustive]
        $vis enum $name {
            $( $(#[$vmeta])* $variant, )*
            /// A value this version of the crate does not know.
            Unknown(u32),
        }

        impl From<u32> for $name {
            fn from(raw: u32) -> Self {
                $( if raw == ($value) as u32 { return $name::$variant; } )*
                $name::Unknown(raw)
            }
        }

        impl From<$name> for u32 {
            fn from(value: $name) -> u32 {
                match value {
                    $( $name::$variant => ($value) as u32, )*
                    $name::Unknown(raw) => raw,
                }
            }
        }
    };
}

pub(crate) use c_enum;
