//! LoRA adapters applied at run time: each projection keeps its base layer as it is (dense,
//! MLX affine, SEED or ggml blocks) and adds `s * B (A x)` for every attached adapter, with a
//! multiplier per adapter that switches it on, off or to any strength without reloading
//! anything (the base weights are never touched, so switching is exact).
//!
//! ```no_run
//! use nnx::adapter::Adapter;
//! use nnx::models::Dense;
//! use nnx::models::llama::Llama;
//! use nnx::models::lora::{Lora, LoraLayers};
//!
//! fn chat_and_code(base: &Llama) -> nnx::Result<Llama<nnx::Host, Lora<Dense>>> {
//!     let (chat, code) = (Adapter::open("chat-adapter")?, Adapter::open("code-adapter")?);
//!     let layers = LoraLayers::new(base, &[&chat, &code], false)?;
//!     let model = base.map_weights::<Lora<Dense>>(|path, layer| Ok(layers.layer(path, layer)))?;
//!     layers.switches().set(1, 0.0); // the code adapter off, the chat one on
//!     Ok(model)
//! }
//! ```

use std::collections::HashMap;
use std::marker::PhantomData;
use std::path::Path;
use std::sync::{Arc, RwLock};

use super::{Project, Weights};
use crate::adapter::{Adapter, Attachment};
use crate::{Compute, Device, Host, Module, Tensor};

/// Projections stored as `W` with LoRA adapters beside them: the weights kind of a model
/// made by `map_weights` with [`LoraLayers::layer`].
#[derive(Clone, Copy, Debug)]
pub struct Lora<W>(PhantomData<W>);

impl<W: Weights> Weights for Lora<W> {
    type Layer<D: Device> = LoraLinear<W::Layer<D>>;
}

/// The multiplier of each attached adapter, shared by every layer: 1 as attached, 0 off.
#[derive(Clone, Debug)]
pub struct Switches(Arc<RwLock<Vec<f32>>>);

impl Switches {
    /// Sets adapter `index`'s multiplier (its scale times this). An index past the adapters
    /// changes nothing.
    pub fn set(&self, index: usize, multiplier: f32) {
        let mut values = self.0.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(value) = values.get_mut(index) {
            *value = multiplier;
        }
    }

    /// The multipliers, in attachment order.
    pub fn get(&self) -> Vec<f32> {
        self.0.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }
}

/// One adapter's factors on one layer.
#[derive(Clone, Debug)]
struct Factors {
    adapter: usize,
    /// Where the adapter was read from and the module the factors are, for errors.
    path: Arc<Path>,
    module: String,
    /// `A`, F32 `[r, in]`.
    a: Tensor,
    /// `B`, F32 `[out, r]`.
    b: Tensor,
    scale: f32,
    bias: Option<Tensor>,
}

/// A projection with adapters: `base(x) + sum_i m_i s_i (B_i (A_i x) + b_i)`, `m_i` the
/// adapter's multiplier in the shared [`Switches`].
#[derive(Clone, Debug)]
pub struct LoraLinear<L> {
    /// The layer as loaded.
    pub base: L,
    factors: Vec<Factors>,
    switches: Switches,
}

impl<L> LoraLinear<L> {
    /// How many adapters reach this layer.
    pub fn adapters(&self) -> usize {
        self.factors.len()
    }
}

#[diagnostic::do_not_recommend]
impl<D: Device, L: Module<D>> Module<D> for LoraLinear<L> {
    // The walk is the base layer's: the model imports and saves as it would without adapters.
    fn walk(&self, visitor: &mut dyn crate::Visitor<D>) {
        self.base.walk(visitor);
    }

    fn walk_mut(&mut self, visitor: &mut dyn crate::VisitorMut<D>) {
        self.base.walk_mut(visitor);
    }
}

impl<L: Project<Host>> Project<Host> for LoraLinear<L> {
    fn project(&self, x: &Tensor) -> crate::Result<Tensor> {
        let mut y = self.base.project(x)?;
        let multipliers = self.switches.get();
        for factors in &self.factors {
            let strength = multipliers.get(factors.adapter).copied().unwrap_or(0.0) * factors.scale;
            if strength == 0.0 {
                continue;
            }
            // A layer kept in ggml blocks shows the adapter its rows only: the width of `A` is
            // first met here, and named before any product.
            let width = factors.a.shape()[1];
            if x.shape().last() != Some(&width) {
                return Err(crate::Error::Adapter {
                    path: factors.path.to_path_buf(),
                    entry: format!("{}.weight", factors.module),
                    problem: format!(
                        "has `A` for inputs of width {width}, but the layer takes inputs of shape {:?}: the adapter belongs to another model",
                        x.shape()
                    ),
                });
            }
            let low = Compute::linear(x, &factors.a, None)?;
            let delta = Compute::linear(&low, &factors.b, factors.bias.as_ref())?;
            y = y.add(&delta.scale(strength)?)?;
        }
        Ok(y)
    }
}

/// The factors of some adapters on one model, ready to wrap its layers ([`LoraLayers::layer`]
/// in the model's `map_weights`), with the [`Switches`] they share.
#[derive(Debug)]
pub struct LoraLayers {
    /// Factors by model path of the layer (`layers.0.attn.q`).
    by_layer: HashMap<String, Vec<Factors>>,
    switches: Switches,
}

impl LoraLayers {
    /// Checks every adapter against `model` (through its import mapping, every module must
    /// reach a weight of its shape) and keeps their factors in the model's layout.
    /// `stored_rope_rows`: the model keeps q and k as a GGUF file stores them (a model from
    /// `nnx::models::load`'s GGUF path), as GGUF adapters' factors are.
    ///
    /// # Errors
    /// [`Error::AdapterMismatch`](crate::Error::AdapterMismatch) for the first adapter that
    /// does not fit, or has modules that only merge (DoRA, embeddings, saved modules).
    pub fn new<M: Module + ?Sized>(
        model: &M,
        adapters: &[&Adapter],
        stored_rope_rows: bool,
    ) -> crate::Result<LoraLayers> {
        let mut by_layer: HashMap<String, Vec<Factors>> = HashMap::new();
        for (index, adapter) in adapters.iter().enumerate() {
            let path: Arc<Path> = Arc::from(adapter.path.as_path());
            for Attachment { target, module, a, b, scale, bias } in adapter.attachments(model, stored_rope_rows)? {
                let layer = target.strip_suffix(".weight").unwrap_or(&target).to_string();
                let factors = Factors { adapter: index, path: path.clone(), module, a, b, scale, bias };
                by_layer.entry(layer).or_default().push(factors);
            }
        }
        Ok(LoraLayers { by_layer, switches: Switches(Arc::new(RwLock::new(vec![1.0; adapters.len()]))) })
    }

    /// `base` (the layer at `path`) with the adapters' factors for it.
    pub fn layer<L: Clone>(&self, path: &str, base: &L) -> LoraLinear<L> {
        LoraLinear {
            base: base.clone(),
            factors: self.by_layer.get(path).cloned().unwrap_or_default(),
            switches: self.switches.clone(),
        }
    }

    /// The multipliers every wrapped layer reads.
    pub fn switches(&self) -> Switches {
        self.switches.clone()
    }
}

/// `adapter` in the layout the model files at `path` (a folder, or a weights file beside its
/// `config.json`) store their weights in, for [`Adapter::merge_archive`]: an MLX-LM adapter's
/// factors are in the model's `[out, in]` layout, and a checkpoint can store a weight
/// transposed (GPT-2's `Conv1D`, `[in, out]`), as the model's import mapping records
/// ([`Adapter::in_model_layout`]). Other adapters come back as they are, and so does any
/// adapter for files without a `config.json` of a model nnx builds (nothing records their
/// layout; the merge then checks each entry's shape as it is).
#[cfg(feature = "text")]
pub fn in_files_layout(adapter: &Adapter, path: &Path) -> Adapter {
    if adapter.format != crate::adapter::AdapterFormat::Mlx {
        return adapter.clone();
    }
    let folder = if path.is_dir() { path } else { path.parent().unwrap_or(path) };
    let config_path = folder.join("config.json");
    if !config_path.is_file() {
        return adapter.clone();
    }
    let Ok(value) = super::read_config::<serde_json::Value>(&config_path, |_, _| Ok(())) else {
        return adapter.clone();
    };
    let model_type = value.get("model_type").and_then(serde_json::Value::as_str).unwrap_or_default();
    super::load::adapter_layout(&config_path, model_type, adapter).unwrap_or_else(|_| adapter.clone())
}
