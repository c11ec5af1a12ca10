//! Element types: every dtype a SafeTensors file can name, with its bit size and spelling.

use std::fmt;
use std::str::FromStr;

/// The element type of a tensor.
///
/// Covers every dtype of the SafeTensors format, sub-byte floats included. `Display` and
/// `FromStr` use the SafeTensors spelling (`"BF16"`, `"F8_E4M3"`), so a dtype printed in an
/// error message can be searched for in a file header as it is.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, PartialOrd, Ord)]
pub enum DType {
    /// Boolean, one byte holding 0 or 1.
    Bool,
    /// MX FP4 (E2M1), two per byte.
    F4,
    /// MX FP6 with 2 exponent and 3 mantissa bits.
    F6E2M3,
    /// MX FP6 with 3 exponent and 2 mantissa bits.
    F6E3M2,
    /// Unsigned 8-bit integer.
    U8,
    /// Signed 8-bit integer.
    I8,
    /// FP8 with 5 exponent and 2 mantissa bits.
    F8E5M2,
    /// FP8 with 4 exponent and 3 mantissa bits.
    F8E4M3,
    /// FP8 scale type with 8 exponent bits and no mantissa.
    F8E8M0,
    /// FP8 E4M3, finite with negative zero used as NaN.
    F8E4M3Fnuz,
    /// FP8 E5M2, finite with negative zero used as NaN.
    F8E5M2Fnuz,
    /// Signed 16-bit integer.
    I16,
    /// Unsigned 16-bit integer.
    U16,
    /// IEEE half precision.
    F16,
    /// Brain floating point (the top half of an f32).
    BF16,
    /// Signed 32-bit integer.
    I32,
    /// Unsigned 32-bit integer.
    U32,
    /// IEEE single precision.
    F32,
    /// Complex number made of two f32.
    C64,
    /// IEEE double precision.
    F64,
    /// Signed 64-bit integer.
    I64,
    /// Unsigned 64-bit integer.
    U64,
}

impl DType {
    /// Every dtype, in the order of the SafeTensors specification.
    pub const ALL: [DType; 22] = [
        DType::Bool,
        DType::F4,
        DType::F6E2M3,
        DType::F6E3M2,
        DType::U8,
        DType::I8,
        DType::F8E5M2,
        DType::F8E4M3,
        DType::F8E8M0,
        DType::F8E4M3Fnuz,
        DType::F8E5M2Fnuz,
        DType::I16,
        DType::U16,
        DType::F16,
        DType::BF16,
        DType::I32,
        DType::U32,
        DType::F32,
        DType::C64,
        DType::F64,
        DType::I64,
        DType::U64,
    ];

    /// Size of one element in bits (4 and 6 for the sub-byte floats).
    pub const fn bits(self) -> usize {
        match self {
            DType::F4 => 4,
            DType::F6E2M3 | DType::F6E3M2 => 6,
            DType::Bool
            | DType::U8
            | DType::I8
            | DType::F8E5M2
            | DType::F8E4M3
            | DType::F8E8M0
            | DType::F8E4M3Fnuz
            | DType::F8E5M2Fnuz => 8,
            DType::I16 | DType::U16 | DType::F16 | DType::BF16 => 16,
            DType::I32 | DType::U32 | DType::F32 => 32,
            DType::C64 | DType::F64 | DType::I64 | DType::U64 => 64,
        }
    }

    /// Size of one element in bytes, or `None` for the sub-byte floats, which have no
    /// addressable element.
    pub const fn size_in_bytes(self) -> Option<usize> {
        let bits = self.bits();
        if bits.is_multiple_of(8) { Some(bits / 8) } else { None }
    }

    /// Byte alignment an element needs to be read in place.
    pub const fn alignment(self) -> usize {
        match self {
            DType::C64 => 4,
            _ => match self.size_in_bytes() {
                Some(size) => size,
                None => 1,
            },
        }
    }

    /// Bytes taken by `elements` packed elements, or `None` when that overflows `u64` or the
    /// elements do not fill whole bytes.
    pub fn storage_bytes(self, elements: u64) -> Option<u64> {
        let bits = elements.checked_mul(self.bits() as u64)?;
        if bits % 8 == 0 { Some(bits / 8) } else { None }
    }

    /// Whether casts among float types accept this dtype: f16, bf16, f32 and f64.
    pub const fn is_castable_float(self) -> bool {
        matches!(self, DType::F16 | DType::BF16 | DType::F32 | DType::F64)
    }

    /// Whether the dtype holds floating-point values of any width.
    pub const fn is_float(self) -> bool {
        matches!(
            self,
            DType::F4
                | DType::F6E2M3
                | DType::F6E3M2
                | DType::F8E5M2
                | DType::F8E4M3
                | DType::F8E8M0
                | DType::F8E4M3Fnuz
                | DType::F8E5M2Fnuz
                | DType::F16
                | DType::BF16
                | DType::F32
                | DType::F64
        )
    }

    /// The name numpy (with `ml_dtypes` for BF16 and FP8), torch, zarr3 and DCP's metadata give
    /// the dtype (`float32`, `bfloat16`, `float8_e4m3fn`); `None` for the sub-byte floats.
    pub const fn numpy_name(self) -> Option<&'static str> {
        Some(match self {
            DType::Bool => "bool",
            DType::F4 | DType::F6E2M3 | DType::F6E3M2 => return None,
            DType::U8 => "uint8",
            DType::I8 => "int8",
            DType::F8E5M2 => "float8_e5m2",
            DType::F8E4M3 => "float8_e4m3fn",
            DType::F8E8M0 => "float8_e8m0fnu",
            DType::F8E4M3Fnuz => "float8_e4m3fnuz",
            DType::F8E5M2Fnuz => "float8_e5m2fnuz",
            DType::I16 => "int16",
            DType::U16 => "uint16",
            DType::F16 => "float16",
            DType::BF16 => "bfloat16",
            DType::I32 => "int32",
            DType::U32 => "uint32",
            DType::F32 => "float32",
            DType::C64 => "complex64",
            DType::F64 => "float64",
            DType::I64 => "int64",
            DType::U64 => "uint64",
        })
    }

    /// The dtype [`DType::numpy_name`] names `name`.
    pub fn from_numpy_name(name: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|dtype| dtype.numpy_name() == Some(name))
    }

    /// The SafeTensors spelling, as written in file headers.
    pub const fn as_str(self) -> &'static str {
        match self {
            DType::Bool => "BOOL",
            DType::F4 => "F4",
            DType::F6E2M3 => "F6_E2M3",
            DType::F6E3M2 => "F6_E3M2",
            DType::U8 => "U8",
            DType::I8 => "I8",
            DType::F8E5M2 => "F8_E5M2",
            DType::F8E4M3 => "F8_E4M3",
            DType::F8E8M0 => "F8_E8M0",
            DType::F8E4M3Fnuz => "F8_E4M3FNUZ",
            DType::F8E5M2Fnuz => "F8_E5M2FNUZ",
            DType::I16 => "I16",
            DType::U16 => "U16",
            DType::F16 => "F16",
            DType::BF16 => "BF16",
            DType::I32 => "I32",
            DType::U32 => "U32",
            DType::F32 => "F32",
            DType::C64 => "C64",
            DType::F64 => "F64",
            DType::I64 => "I64",
            DType::U64 => "U64",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The text given to [`DType::from_str`] names no SafeTensors dtype.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown dtype `{0}`: expected one of BOOL, U8, I8, I16, U16, F16, BF16, I32, U32, F32, F64, I64, U64, C64, F8_E4M3, F8_E5M2, F8_E8M0, F8_E4M3FNUZ, F8_E5M2FNUZ, F6_E2M3, F6_E3M2, F4"
)]
pub struct UnknownDType(pub String);

impl FromStr for DType {
    type Err = UnknownDType;

    /// Parses the SafeTensors spelling; lowercase (`"bf16"`, `"f8_e4m3"`) is accepted too.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let upper = text.to_ascii_uppercase();
        DType::ALL.into_iter().find(|dtype| dtype.as_str() == upper).ok_or_else(|| UnknownDType(text.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spelling_round_trips() {
        for dtype in DType::ALL {
            assert_eq!(dtype.as_str().parse::<DType>().unwrap(), dtype);
            assert_eq!(dtype.to_string().to_lowercase().parse::<DType>().unwrap(), dtype);
        }
        assert!("F128".parse::<DType>().is_err());
    }

    #[test]
    fn bit_sizes_follow_the_format() {
        assert_eq!(DType::F4.bits(), 4);
        assert_eq!(DType::F6E3M2.bits(), 6);
        assert_eq!(DType::F8E4M3.bits(), 8);
        assert_eq!(DType::BF16.size_in_bytes(), Some(2));
        assert_eq!(DType::C64.size_in_bytes(), Some(8));
        assert_eq!(DType::F4.size_in_bytes(), None);
        assert_eq!(DType::F4.storage_bytes(6), Some(3));
        assert_eq!(DType::F6E2M3.storage_bytes(3), None);
        assert_eq!(DType::F6E2M3.storage_bytes(4), Some(3));
        assert_eq!(DType::U64.storage_bytes(u64::MAX), None);
    }
}
