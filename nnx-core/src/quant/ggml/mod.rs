//! ggml's block encodings, the tensor types of GGUF files: the table of types (id, name, block
//! size, bytes per block), bit-exact decoding of every type the `gguf` Python package decodes,
//! the reference quantizers, and products that read the packed blocks directly.
//!
//! A row of `n` values of a block type is `n / block_size` blocks laid end to end; nothing in
//! the blocks is aligned, so every multi-byte field is read with little-endian loads.

mod dequant;
#[cfg(feature = "kernels")]
mod dot;
mod grids;
#[cfg(feature = "kernels")]
mod linear;
mod quantize;

pub use dequant::dequantize_row;
#[cfg(feature = "kernels")]
pub use dot::{matmul, matvec, matvec_many};
#[cfg(feature = "kernels")]
pub use linear::GgmlLinear;
pub use quantize::{can_quantize, mxfp4_from_pairs, quantize_row};

use crate::error::{Error, Result};

/// A ggml tensor type, by its id in GGUF tensor infos (`ggml_type` in `ggml.h`). Ids that ggml
/// removed (4, 5, 31-33, 36-38) and activation-only types are not types here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[allow(non_camel_case_types)]
#[non_exhaustive]
pub enum GgmlType {
    /// 32-bit float.
    F32,
    /// IEEE half.
    F16,
    /// 32 values: `f16 d`, 4-bit `q`; `d * (q - 8)`.
    Q4_0,
    /// 32 values: `f16 d, m`, 4-bit `q`; `d * q + m`.
    Q4_1,
    /// 32 values: `f16 d`, 5-bit `q`; `d * (q - 16)`.
    Q5_0,
    /// 32 values: `f16 d, m`, 5-bit `q`; `d * q + m`.
    Q5_1,
    /// 32 values: `f16 d`, `i8 q`; `d * q`.
    Q8_0,
    /// 32 values with a precomputed sum: an activation type of ggml's products.
    Q8_1,
    /// 256 values in 16 groups with 4-bit scales and mins, 2-bit `q`.
    Q2_K,
    /// 256 values in 16 groups with 6-bit scales, 3-bit `q`.
    Q3_K,
    /// 256 values in 8 groups with 6-bit scales and mins, 4-bit `q`.
    Q4_K,
    /// 256 values in 8 groups with 6-bit scales and mins, 5-bit `q`.
    Q5_K,
    /// 256 values in 16 groups with 8-bit scales, 6-bit `q`.
    Q6_K,
    /// 256 values with an f32 scale and 8-bit `q`: an activation type of ggml's products.
    Q8_K,
    /// 256 values from a 256-entry lattice with signs, 2.06 bits per value.
    IQ2_XXS,
    /// 256 values from a 512-entry lattice with 4-bit scales, 2.31 bits per value.
    IQ2_XS,
    /// 256 values from a 256-entry lattice, 3.06 bits per value.
    IQ3_XXS,
    /// 256 values from a 2048-entry lattice, 1.56 bits per value.
    IQ1_S,
    /// 32 values: `f16 d`, 4-bit indices into a non-linear 16-entry codebook.
    IQ4_NL,
    /// 256 values from a 512-entry lattice, 3.44 bits per value.
    IQ3_S,
    /// 256 values from a 1024-entry lattice, 2.56 bits per value.
    IQ2_S,
    /// 256 values: IQ4_NL's codebook with 6-bit scales per 32, 4.25 bits per value.
    IQ4_XS,
    /// 8-bit integer.
    I8,
    /// 16-bit integer.
    I16,
    /// 32-bit integer.
    I32,
    /// 64-bit integer.
    I64,
    /// 64-bit float.
    F64,
    /// 256 values from IQ1_S's lattice with scales packed beside, 1.75 bits per value.
    IQ1_M,
    /// bfloat16.
    BF16,
    /// 256 ternary values packed five to a byte, 1.69 bits per value.
    TQ1_0,
    /// 256 ternary values in 2 bits each, 2.06 bits per value.
    TQ2_0,
    /// 32 values: an E8M0 exponent and 4-bit E2M1 values (OCP microscaling).
    MXFP4,
    /// 64 values: four UE4M3 scales and 4-bit E2M1 values.
    NVFP4,
}

/// Each type's id, name, values per block and bytes per block, as ggml's type traits give them.
const TABLE: &[(GgmlType, u32, &str, usize, usize)] = &[
    (GgmlType::F32, 0, "F32", 1, 4),
    (GgmlType::F16, 1, "F16", 1, 2),
    (GgmlType::Q4_0, 2, "Q4_0", 32, 18),
    (GgmlType::Q4_1, 3, "Q4_1", 32, 20),
    (GgmlType::Q5_0, 6, "Q5_0", 32, 22),
    (GgmlType::Q5_1, 7, "Q5_1", 32, 24),
    (GgmlType::Q8_0, 8, "Q8_0", 32, 34),
    (GgmlType::Q8_1, 9, "Q8_1", 32, 36),
    (GgmlType::Q2_K, 10, "Q2_K", 256, 84),
    (GgmlType::Q3_K, 11, "Q3_K", 256, 110),
    (GgmlType::Q4_K, 12, "Q4_K", 256, 144),
    (GgmlType::Q5_K, 13, "Q5_K", 256, 176),
    (GgmlType::Q6_K, 14, "Q6_K", 256, 210),
    (GgmlType::Q8_K, 15, "Q8_K", 256, 292),
    (GgmlType::IQ2_XXS, 16, "IQ2_XXS", 256, 66),
    (GgmlType::IQ2_XS, 17, "IQ2_XS", 256, 74),
    (GgmlType::IQ3_XXS, 18, "IQ3_XXS", 256, 98),
    (GgmlType::IQ1_S, 19, "IQ1_S", 256, 50),
    (GgmlType::IQ4_NL, 20, "IQ4_NL", 32, 18),
    (GgmlType::IQ3_S, 21, "IQ3_S", 256, 110),
    (GgmlType::IQ2_S, 22, "IQ2_S", 256, 82),
    (GgmlType::IQ4_XS, 23, "IQ4_XS", 256, 136),
    (GgmlType::I8, 24, "I8", 1, 1),
    (GgmlType::I16, 25, "I16", 1, 2),
    (GgmlType::I32, 26, "I32", 1, 4),
    (GgmlType::I64, 27, "I64", 1, 8),
    (GgmlType::F64, 28, "F64", 1, 8),
    (GgmlType::IQ1_M, 29, "IQ1_M", 256, 56),
    (GgmlType::BF16, 30, "BF16", 1, 2),
    (GgmlType::TQ1_0, 34, "TQ1_0", 256, 54),
    (GgmlType::TQ2_0, 35, "TQ2_0", 256, 66),
    (GgmlType::MXFP4, 39, "MXFP4", 32, 17),
    (GgmlType::NVFP4, 40, "NVFP4", 64, 36),
];

impl GgmlType {
    /// Every type, in id order.
    pub fn all() -> impl Iterator<Item = GgmlType> {
        TABLE.iter().map(|row| row.0)
    }

    fn row(self) -> &'static (GgmlType, u32, &'static str, usize, usize) {
        TABLE.iter().find(|row| row.0 == self).expect("every type has a row")
    }

    /// The type of a GGUF tensor info's id; `None` for ids ggml does not define or removed.
    pub fn from_id(id: u32) -> Option<GgmlType> {
        TABLE.iter().find(|row| row.1 == id).map(|row| row.0)
    }

    /// The type named as ggml names it (`"Q4_K"`, `"bf16"`: case does not matter).
    pub fn from_name(name: &str) -> Option<GgmlType> {
        TABLE.iter().find(|row| row.2.eq_ignore_ascii_case(name)).map(|row| row.0)
    }

    /// The id stored in GGUF tensor infos.
    pub fn id(self) -> u32 {
        self.row().1
    }

    /// ggml's name (`"Q4_K"`).
    pub fn name(self) -> &'static str {
        self.row().2
    }

    /// Values per block (1 for plain types).
    pub fn block_size(self) -> usize {
        self.row().3
    }

    /// Bytes per block.
    pub fn type_size(self) -> usize {
        self.row().4
    }

    /// Whether values are packed in blocks (rather than one element each).
    pub fn is_quantized(self) -> bool {
        self.block_size() > 1
    }

    /// Stored bits per value (`4.5` for Q4_0).
    pub fn bits_per_weight(self) -> f64 {
        (self.type_size() * 8) as f64 / self.block_size() as f64
    }

    /// Bytes of a row of `values` values; `None` when the row does not hold whole blocks.
    pub fn row_bytes(self, values: usize) -> Option<usize> {
        if !values.is_multiple_of(self.block_size()) {
            return None;
        }
        (values / self.block_size()).checked_mul(self.type_size())
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Checks that `bytes` are whole blocks of `ty` for `values` values (the shared precondition of
/// every row function here).
fn check_row(op: &'static str, ty: GgmlType, bytes: usize, values: usize) -> Result<()> {
    match ty.row_bytes(values) {
        Some(expected) if expected == bytes => Ok(()),
        _ => Err(Error::GgmlRow { op, ty: ty.name(), block_size: ty.block_size(), values, bytes }),
    }
}
