//! LoRA adapters: low-rank factors that change some of a base model's weights, as PEFT,
//! MLX-LM and llama.cpp store them, read into one [`Adapter`] and merged into a derived module
//! through the module's own import mapping, every name and shape checked before anything
//! changes.
//!
//! All three formats come down to the same thing per adapted module: `A` (`[r, in]`), `B`
//! (`[out, r]`) and a scale `s`, the weight becoming `W + s * B A`. They differ in names,
//! orientation and how `s` is given:
//!
//! | format | files | factors | scale |
//! |---|---|---|---|
//! | PEFT | `adapter_config.json`, `adapter_model.safetensors` (or `.bin`) | `base_model.model.<path>.lora_A.weight` `[r, in]`, `lora_B.weight` `[out, r]` | `lora_alpha / r`, or `/ sqrt(r)` with `use_rslora`; per-module `rank_pattern` / `alpha_pattern` |
//! | MLX-LM | `adapter_config.json`, `adapters.safetensors` | `<path>.lora_a` `[in, r]`, `lora_b` `[r, out]` | `lora_parameters.scale` (default 20), a plain multiplier |
//! | GGUF | one `.gguf` with `adapter.type = lora` | `<tensor>.lora_a` `[r, in]`, `.lora_b` `[out, r]` | `adapter.lora.alpha / r` |

use std::collections::BTreeMap;
use std::path::PathBuf;

use nnx_core::{Naming, Tensor};
use serde_json::Value;

use crate::error::Result;

mod attach; // the factors as a model reads its weights, for applying at run time
mod gguf_names; // an adapter renamed to a GGUF file's tensor names
mod merge; // merges into a module, an archive's entries and a GGUF file
mod plan; // an adapter checked against a module through its import mapping
mod read; // PEFT, MLX-LM and GGUF adapters read
mod report; // what an adapter found in a model, and the errors
mod save; // PEFT's layout written

pub use attach::Attachment;
pub use merge::Merged;
pub use report::{AdapterProblem, AdapterReport};

/// Where an adapter came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdapterFormat {
    /// Hugging Face PEFT (`adapter_config.json` with `peft_type`).
    Peft,
    /// MLX-LM (`adapters.safetensors`, `lora_parameters` in its config).
    Mlx,
    /// llama.cpp's GGUF LoRA (`adapter.type = lora`).
    Gguf,
}

impl AdapterFormat {
    /// The source names the adapter's module paths follow.
    pub fn naming(self) -> Naming {
        match self {
            AdapterFormat::Peft | AdapterFormat::Mlx => Naming::Transformers,
            AdapterFormat::Gguf => Naming::Gguf,
        }
    }
}

/// What an adapted module is: its weight multiplies inputs, or is a lookup table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoraKind {
    /// A projection (linear layer): `W [out, in] += s * B A`.
    Projection,
    /// A lookup table (embedding): `E [num_embeddings, dim] += s * (B A)ᵀ`, with `A [r,
    /// num_embeddings]` and `B [dim, r]` (PEFT's `lora_embedding_A` and `lora_embedding_B`).
    Lookup,
}

/// The factors of one adapted module.
#[derive(Debug, Clone)]
pub struct LoraModule {
    /// The module's source path in the adapter's naming, without `.weight`
    /// (`model.layers.0.self_attn.q_proj`, or `blk.0.attn_q` for GGUF).
    pub source: String,
    /// Linear or embedding.
    pub kind: LoraKind,
    /// `A`, F32 `[r, in]` (`[r, num_embeddings]` for an embedding).
    pub a: Tensor,
    /// `B`, F32 `[out, r]` (`[dim, r]` for an embedding).
    pub b: Tensor,
    /// The scale of `B A`.
    pub scale: f32,
    /// The base stores this weight `[in, out]` (GPT-2's `Conv1D`): the delta is transposed.
    pub fan_in_fan_out: bool,
    /// DoRA's magnitude per output row, F32 `[out]`.
    pub magnitude: Option<Tensor>,
    /// A trained bias added to the layer's bias times the scale (PEFT's `lora_bias`).
    pub bias: Option<Tensor>,
}

impl LoraModule {
    /// The rank `r`.
    pub fn rank(&self) -> usize {
        self.a.shape()[0]
    }

    /// `s * B A` as the base stores the weight (`[out, in]`, or `[in, out]` with
    /// `fan_in_fan_out`; `[num_embeddings, dim]` for an embedding), in f32.
    ///
    /// # Errors
    /// A factor that is not f32 on the host.
    pub fn delta(&self) -> Result<Tensor> {
        // `B A` in f32 as PEFT computes it (the matrix kernels), then scaled.
        #[cfg(feature = "kernels")]
        let product = self.b.matmul(&self.a)?.to_vec::<f32>()?;
        #[cfg(not(feature = "kernels"))]
        let product = {
            let (a, b) = (self.a.to_vec::<f32>()?, self.b.to_vec::<f32>()?);
            let (r, inner) = (self.a.shape()[0], self.a.shape()[1]);
            let mut product = vec![0f32; self.b.shape()[0] * inner];
            for (o, row) in product.chunks_exact_mut(inner.max(1)).enumerate() {
                for (i, value) in row.iter_mut().enumerate() {
                    *value = (0..r).map(|k| b[o * r + k] * a[k * inner + i]).sum();
                }
            }
            product
        };
        let values: Vec<f32> = product.into_iter().map(|value| value * self.scale).collect();
        let delta = Tensor::from_vec(values, &[self.b.shape()[0], self.a.shape()[1]])?;
        Ok(if self.transposed() { delta.transpose(0, 1)?.contiguous() } else { delta })
    }

    /// Whether the base stores the weight as `(B A)ᵀ`: `fan_in_fan_out`, and embeddings.
    fn transposed(&self) -> bool {
        match self.kind {
            LoraKind::Projection => self.fan_in_fan_out,
            LoraKind::Lookup => true,
        }
    }

    /// The shape [`LoraModule::delta`] has, without computing it.
    fn delta_shape(&self) -> Vec<usize> {
        let (out, inner) = (self.b.shape()[0], self.a.shape()[1]);
        if self.transposed() { vec![inner, out] } else { vec![out, inner] }
    }
}

/// A LoRA adapter: the factors of every adapted module and the whole tensors it replaces
/// (PEFT's `modules_to_save`).
#[derive(Debug, Clone)]
pub struct Adapter {
    /// Where it was read from.
    pub path: PathBuf,
    /// Its format.
    pub format: AdapterFormat,
    /// The adapted modules, in file order.
    pub modules: Vec<LoraModule>,
    /// Tensors the adapter replaces whole, by source name (`lm_head.weight`).
    pub saved: BTreeMap<String, Tensor>,
    /// The configuration as stored (`adapter_config.json`; for GGUF, the `adapter.*` keys).
    pub config: Value,
}

/// The prefix PEFT puts before every module path (its `PeftModel` wrapping the base model).
const PEFT_PREFIX: &str = "base_model.model.";

impl Adapter {
    /// This adapter with every module's scale multiplied by `factor` (`--lora ADAPTER:SCALE`;
    /// 0 leaves the base as it is, 2 doubles the change).
    pub fn scaled(&self, factor: f32) -> Adapter {
        let mut scaled = self.clone();
        for module in &mut scaled.modules {
            module.scale *= factor;
        }
        scaled
    }

    /// The ranks of the modules, smallest and largest.
    pub fn ranks(&self) -> (usize, usize) {
        let ranks = self.modules.iter().map(LoraModule::rank);
        (ranks.clone().min().unwrap_or(0), ranks.max().unwrap_or(0))
    }
}
