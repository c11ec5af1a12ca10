//! The Rust types a tensor's elements can be read into and built from.

use crate::DType;

mod sealed {
    pub trait Sealed {}
}

/// A Rust type that is exactly one element of some [`DType`].
///
/// Sealed: the set of element types is the set of dtypes with a native Rust representation,
/// and `Tensor::to_vec` relies on `DTYPE` matching the bytes it reads.
pub trait Element: sealed::Sealed + Copy + Send + Sync + 'static {
    /// The dtype whose elements this type represents.
    const DTYPE: DType;
}

macro_rules! element {
    ($($ty:ty => $dtype:ident),* $(,)?) => {$(
        impl sealed::Sealed for $ty {}
        impl Element for $ty {
            const DTYPE: DType = DType::$dtype;
        }
    )*};
}

element! {
    f32 => F32,
    f64 => F64,
    half::f16 => F16,
    half::bf16 => BF16,
    u8 => U8,
    i8 => I8,
    u16 => U16,
    i16 => I16,
    u32 => U32,
    i32 => I32,
    u64 => U64,
    i64 => I64,
    bool => Bool,
}
