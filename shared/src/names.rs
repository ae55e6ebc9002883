//! The closed sets of names stored in Redis and shown to clients (states,
//! reason kinds, networks, fields, scripts): the names are derived by `strum`
//! from the variants, and [`stored_names!`] adds the same `ALL` and `as_str`
//! to each, so no set spells its names out by hand.

/// A stored name that is not one of a closed set's.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[error("unknown {what} {name:?}")]
pub struct UnknownName {
    /// What kind of name was expected ("task state", "network", ...).
    pub what: &'static str,
    pub name: String,
}

/// `ALL` (every variant, in declaration order) and `const fn as_str` for an
/// enum deriving `strum::VariantArray` and `strum::IntoStaticStr` (with
/// `const_into_str`). With `parse "what"`, also `unknown`, the
/// `parse_err_fn` of its `strum::EnumString`, naming the set as `what`.
macro_rules! stored_names {
    ($t:ty) => {
        impl $t {
            /// Every variant, in declaration order.
            pub const ALL: &[$t] = <$t as strum::VariantArray>::VARIANTS;

            /// The stored name.
            pub const fn as_str(self) -> &'static str {
                self.into_str()
            }
        }
    };
    ($t:ty, parse $what:literal) => {
        stored_names!($t);

        impl $t {
            fn unknown(name: &str) -> $crate::names::UnknownName {
                $crate::names::UnknownName {
                    what: $what,
                    name: name.to_owned(),
                }
            }
        }
    };
}

pub(crate) use stored_names;
