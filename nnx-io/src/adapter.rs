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

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use nnx_core::{DType, ImportOp, Module, Naming, Tensor, for_each_entry_mut, for_each_entry_named};
use serde_json::Value;

use crate::archive::Archive;
use crate::error::{Error, Result};

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
    /// Reads the adapter at `path`: a folder with `adapter_config.json` (PEFT or MLX-LM, told
    /// apart by the config), or a GGUF LoRA file.
    ///
    /// # Errors
    /// [`Error::Adapter`] naming the file and entry for a config or tensor that does not make
    /// an adapter; the errors of reading the files.
    pub fn open(path: impl AsRef<Path>) -> Result<Adapter> {
        let path = path.as_ref();
        if path.is_file() {
            if path.extension().is_some_and(|extension| extension == "gguf") {
                return read_gguf(path);
            }
            return match path.parent() {
                Some(dir) if dir.join("adapter_config.json").is_file() => Adapter::open(dir),
                _ => Err(problem(
                    path,
                    "",
                    "is not an adapter: expected a folder with `adapter_config.json` or a GGUF LoRA file",
                )),
            };
        }
        let config_path = path.join("adapter_config.json");
        let text = std::fs::read_to_string(&config_path).map_err(Error::io("read", &config_path))?;
        let config: Value = serde_json::from_str(&text).map_err(|error| {
            problem(&config_path, "", &format!("is not JSON ({error}): fix or regenerate the file"))
        })?;
        if config.get("lora_parameters").is_some() { read_mlx(path, config) } else { read_peft(path, config) }
    }

    /// Writes the adapter in PEFT's layout into the folder `dir` (created if needed):
    /// `adapter_config.json` (`r` the largest rank, `lora_alpha` and per-module `rank_pattern`
    /// / `alpha_pattern` entries that give every module its rank and scale, `use_dora`,
    /// `lora_bias`, `fan_in_fan_out`, `target_modules`, `modules_to_save`) and
    /// `adapter_model.safetensors` (`base_model.model.<path>.lora_A.weight` ...), which PEFT's
    /// `PeftModel.from_pretrained` loads. An MLX-LM adapter becomes a PEFT one this way.
    ///
    /// # Errors
    /// [`Error::Adapter`] for a GGUF adapter (its names are llama.cpp's, not the module paths
    /// PEFT needs) or modules that mix `fan_in_fan_out`; the errors of writing.
    pub fn save_peft(&self, dir: impl AsRef<Path>) -> Result<()> {
        let dir = dir.as_ref();
        if self.format == AdapterFormat::Gguf {
            return Err(problem(
                &self.path,
                "",
                "is a GGUF adapter, named by llama.cpp's tensor names: PEFT needs the model's module paths (save the PEFT or MLX-LM adapter it was converted from)",
            ));
        }
        let fan_in_fan_out = self.modules.iter().any(|module| module.fan_in_fan_out);
        if let Some(other) =
            self.modules.iter().find(|m| m.fan_in_fan_out != fan_in_fan_out && m.kind == LoraKind::Projection)
        {
            return Err(problem(
                &self.path,
                &other.source,
                "differs from the other modules in `fan_in_fan_out`, which PEFT sets once per adapter",
            ));
        }
        let (_, rank) = self.ranks();
        let alpha = |module: &LoraModule| f64::from(module.scale) * module.rank() as f64;
        let lora_alpha = self.modules.first().map_or(8.0, alpha);
        let (mut rank_pattern, mut alpha_pattern) = (serde_json::Map::new(), serde_json::Map::new());
        let mut targets: Vec<String> = Vec::new();
        let mut archive = Archive::new();
        for module in &self.modules {
            // Each key a regular expression for this one module's whole path.
            let key = regex::escape(&module.source);
            if module.rank() != rank {
                rank_pattern.insert(key.clone(), Value::from(module.rank()));
            }
            if alpha(module) != lora_alpha {
                alpha_pattern.insert(key, Value::from(alpha(module)));
            }
            let last = module.source.rsplit('.').next().unwrap_or(&module.source).to_string();
            if !targets.contains(&last) {
                targets.push(last);
            }
            let stem = format!("{PEFT_PREFIX}{}", module.source);
            let (a, b) = match module.kind {
                LoraKind::Projection => ("lora_A.weight", "lora_B.weight"),
                LoraKind::Lookup => ("lora_embedding_A", "lora_embedding_B"),
            };
            archive.insert(format!("{stem}.{a}"), module.a.clone());
            archive.insert(format!("{stem}.{b}"), module.b.clone());
            if let Some(magnitude) = &module.magnitude {
                archive.insert(format!("{stem}.lora_magnitude_vector"), magnitude.clone());
            }
            if let Some(bias) = &module.bias {
                archive.insert(format!("{stem}.lora_B.bias"), bias.clone());
            }
        }
        targets.sort();
        let mut saved: Vec<&str> = Vec::new();
        for (name, tensor) in &self.saved {
            let stem = name.rsplit_once('.').map_or(name.as_str(), |(stem, _)| stem);
            // The saved weight of an adapted module is its base layer's, as PEFT names it.
            if self.modules.iter().any(|module| module.source == stem) {
                let field = &name[stem.len()..];
                archive.insert(format!("{PEFT_PREFIX}{stem}.base_layer{field}"), tensor.clone());
                continue;
            }
            archive.insert(format!("{PEFT_PREFIX}{name}"), tensor.clone());
            if !saved.contains(&stem) {
                saved.push(stem);
            }
        }
        let config = serde_json::json!({
            "peft_type": "LORA",
            "task_type": self.config.get("task_type").cloned().unwrap_or(Value::Null),
            "base_model_name_or_path": self.config.get("base_model_name_or_path").cloned().unwrap_or(Value::Null),
            "r": rank,
            "lora_alpha": lora_alpha,
            "lora_dropout": 0.0,
            "target_modules": targets,
            "rank_pattern": rank_pattern,
            "alpha_pattern": alpha_pattern,
            "use_rslora": false,
            "use_dora": self.modules.iter().any(|module| module.magnitude.is_some()),
            "lora_bias": self.modules.iter().any(|module| module.bias.is_some()),
            "bias": "none",
            "fan_in_fan_out": fan_in_fan_out,
            "modules_to_save": if saved.is_empty() { Value::Null } else { Value::from(saved) },
            "inference_mode": true,
        });
        std::fs::create_dir_all(dir).map_err(Error::io("create", dir))?;
        let text = serde_json::to_string_pretty(&config).expect("a JSON value serializes") + "\n";
        crate::fs::write_atomic(dir.join("adapter_config.json"), text.as_bytes())?;
        archive.save(dir.join("adapter_model.safetensors"))
    }

    /// This adapter with every module's scale multiplied by `factor` (`--lora ADAPTER:SCALE`;
    /// 0 leaves the base as it is, 2 doubles the change).
    pub fn scaled(&self, factor: f32) -> Adapter {
        let mut scaled = self.clone();
        for module in &mut scaled.modules {
            module.scale *= factor;
        }
        scaled
    }

    /// [`Adapter::open`] for a local path or an `hf://` one: `hf://owner/repo[@revision]` is
    /// an adapter repository (its `adapter_config.json` and factors fetched into the Hub cache,
    /// or found there offline), `hf://owner/repo/file.gguf` a GGUF LoRA file.
    ///
    /// # Errors
    /// As [`Adapter::open`], and the Hub's errors (a repository without `adapter_config.json`
    /// named).
    pub fn open_source(source: &str) -> Result<Adapter> {
        if !source.starts_with("hf://") || source.ends_with(".gguf") || source.ends_with(".json") {
            return Adapter::open(crate::hub::local_path(source)?);
        }
        let repo = source.trim_end_matches('/');
        let config = crate::hub::local_path(&format!("{repo}/adapter_config.json"))?;
        let dir = config.parent().map(Path::to_path_buf).unwrap_or_default();
        let mut last = None;
        for weights in ["adapter_model.safetensors", "adapters.safetensors", "adapter_model.bin"] {
            match crate::hub::local_path(&format!("{repo}/{weights}")) {
                Ok(_) => return Adapter::open(&dir),
                Err(error) => last = Some(error),
            }
        }
        Err(last.unwrap_or_else(|| problem(&dir, "adapter_model.safetensors", "is missing from the repository")))
    }

    /// The error for `problems` of this adapter on `target`.
    /// The first [`LISTED_PROBLEMS`] are listed and the rest counted, so that an adapter of
    /// thousands of modules for another model gives a readable error.
    fn mismatch(&self, target: String, problems: &[AdapterProblem]) -> Error {
        let mut listed: Vec<String> = problems.iter().take(LISTED_PROBLEMS).map(ToString::to_string).collect();
        if problems.len() > LISTED_PROBLEMS {
            listed.push(format!("and {} more problems", problems.len() - LISTED_PROBLEMS));
        }
        Error::AdapterMismatch { path: self.path.clone(), target, problems: listed }
    }

    /// This adapter in the layout `model` reads its weights from. MLX-LM's factors are in the
    /// model's own `[out, in]` layout whatever the checkpoint stores (mlx-lm turns GPT-2's
    /// `Conv1D` weights, stored `[in, out]`, when it loads them), so every module whose source
    /// weight the model's import mapping transposes gets `fan_in_fan_out`, as PEFT records it
    /// for the same weights. mlx-lm names every module under `model.` (GPT-2's `h.0.attn.c_attn`
    /// is `model.h.0.attn.c_attn`), while a transformers checkpoint may keep another root
    /// (`transformer.h.0.attn.c_attn`): a module whose weight the model does not read under its
    /// own name takes the one source that ends with its name after `model.`. PEFT and GGUF
    /// adapters are in their files' layout already and come back as they are. [`Adapter::check`], [`Adapter::merge_into`] and
    /// [`Adapter::attachments`] apply this themselves; [`Adapter::merge_archive`], which sees
    /// no model, needs it applied first.
    pub fn in_model_layout<M: Module + ?Sized>(&self, model: &M) -> Adapter {
        let mut adapter = self.clone();
        if self.format != AdapterFormat::Mlx {
            return adapter;
        }
        let mut transposed: HashMap<String, bool> = HashMap::new();
        for_each_entry_named(model, self.format.naming(), |slot, _| {
            if slot.tie.is_none() {
                let turns = slot.ops.iter().filter(|op| matches!(op, ImportOp::Transpose)).count();
                transposed.insert(slot.source.to_string(), turns % 2 == 1);
            }
        });
        for module in &mut adapter.modules {
            let mut source = format!("{}.weight", module.source);
            if !transposed.contains_key(&source)
                && let Some(rest) = module.source.strip_prefix("model.")
            {
                let (whole, suffix) = (format!("{rest}.weight"), format!(".{rest}.weight"));
                let mut found = transposed.keys().filter(|key| **key == whole || key.ends_with(&suffix));
                if let (Some(only), None) = (found.next(), found.next()) {
                    source = only.clone();
                    module.source = only.trim_end_matches(".weight").to_string();
                }
            }
            module.fan_in_fan_out = module.kind == LoraKind::Projection && transposed.get(&source) == Some(&true);
        }
        adapter
    }

    /// The ranks of the modules, smallest and largest.
    pub fn ranks(&self) -> (usize, usize) {
        let ranks = self.modules.iter().map(LoraModule::rank);
        (ranks.clone().min().unwrap_or(0), ranks.max().unwrap_or(0))
    }

    /// Checks that every module and saved tensor of the adapter has its target in `model`
    /// (through the model's import mapping for the adapter's naming) with the right shape,
    /// and lists what it finds. Changes nothing.
    pub fn check<M: Module + ?Sized>(&self, model: &M) -> AdapterReport {
        self.in_model_layout(model).plan(model, false).0
    }

    /// Merges the adapter into `model`: each target weight becomes `W + s * B A` (DoRA's
    /// magnitudes applied, biases added, saved tensors replacing theirs), computed in f32 and
    /// cast back to the weight's dtype. Nothing changes unless every module fits.
    ///
    /// The returned [`Merged`] holds the weights as they were, so that
    /// [`Merged::unmerge`] restores them bit for bit.
    ///
    /// # Errors
    /// [`Error::AdapterMismatch`] listing every module that has no target, a target of
    /// another shape, or one packed in ggml blocks (merge those into the file with
    /// [`Adapter::merge_gguf`], or attach the adapter at run time).
    pub fn merge_into<M: Module + ?Sized>(&self, model: &mut M) -> Result<Merged> {
        let adapter = self.in_model_layout(model);
        let (report, targets) = adapter.plan(model, false);
        if !report.problems.is_empty() {
            return Err(self.mismatch(model_name::<M>(), &report.problems));
        }
        // The new value of every model tensor that changes, computed before any is replaced.
        let mut current: HashMap<String, Tensor> = HashMap::new();
        for_each_entry_named(model, self.format.naming(), |slot, tensor| {
            if targets.contains_key(slot.name) {
                current.insert(slot.name.to_string(), tensor.clone());
            }
        });
        let mut updated: HashMap<String, Tensor> = HashMap::new();
        for (name, changes) in &targets {
            let mut value = current[name].clone();
            // A saved copy of the weight first (PEFT saves an adapted embedding's), then deltas.
            for change in changes {
                value = match change {
                    Change::Replace(tensor) => tensor.to_dtype(value.dtype())?,
                    Change::Add { delta, magnitude } => add_delta(&value, delta, magnitude.as_ref())?,
                    Change::Module { module, ops, magnitude } => {
                        let delta = through_ops(&adapter.modules[*module].delta()?, ops)
                            .map_err(|reason| problem(&self.path, &adapter.modules[*module].source, &reason))?;
                        add_delta(&value, &delta, magnitude.as_ref())?
                    }
                };
            }
            updated.insert(name.clone(), value);
        }
        let mut originals = Vec::new();
        for_each_entry_mut(model, |slot, tensor| {
            if let Some(value) = updated.remove(slot.name) {
                originals.push((slot.name.to_string(), std::mem::replace(tensor, value)));
            }
        });
        Ok(Merged { originals, report })
    }

    /// The entries of `base` (a model's weights under their source names, as the adapter
    /// names them) with the adapter merged in: each target `W + s * B A` (DoRA's magnitudes
    /// applied, trained biases added, saved modules replacing theirs) in the entry's dtype,
    /// every other entry a view of `base`. What `nnx lora merge` writes.
    ///
    /// # Errors
    /// [`Error::AdapterMismatch`] listing every module without an entry or with an entry of
    /// another shape or a dtype that is not a float (nothing is merged then); the errors of
    /// reading the entries.
    pub fn merge_archive(&self, base: &Archive) -> Result<Archive> {
        let mut merged = base.select("");
        let mut problems = Vec::new();
        let names: Vec<&str> = base.names().collect();
        // Saved modules first: an adapted embedding's saved copy is the weight its delta adds to.
        let mut replaced: HashMap<String, Tensor> = HashMap::new();
        for (name, tensor) in &self.saved {
            match base.entry_spec(name)? {
                Some((dtype, shape)) if shape == tensor.shape() && dtype.is_castable_float() => {
                    replaced.insert(name.clone(), tensor.to_dtype(dtype)?);
                }
                Some((_, shape)) => problems.push(AdapterProblem::Shape {
                    module: name.clone(),
                    target: name.clone(),
                    expected: shape,
                    found: tensor.shape().to_vec(),
                }),
                None => problems.push(no_target(&problems, name, names.iter().copied())),
            }
        }
        // The merged value of entry `name`, or `None` with the problem recorded. A module's
        // delta is computed only once its shape is the entry's, the entry a float whose bytes
        // are in the file, and no problem found so far (nothing is merged then anyway): the
        // factors alone can describe a product of any size.
        let merge = |name: &str, change: Change, problems: &mut Vec<AdapterProblem>| -> Result<Option<Tensor>> {
            let Some((dtype, shape)) = base.entry_spec(name)? else {
                problems.push(no_target(problems, name, names.iter().copied()));
                return Ok(None);
            };
            let found = match &change {
                Change::Add { delta, .. } => delta.shape().to_vec(),
                Change::Replace(tensor) => tensor.shape().to_vec(),
                Change::Module { module, .. } => self.modules[*module].delta_shape(),
            };
            if found != shape {
                let (module, target) = (name.to_string(), name.to_string());
                problems.push(AdapterProblem::Shape { module, target, expected: shape, found });
                return Ok(None);
            }
            if !dtype.is_castable_float() {
                let reason = format!("is {dtype}; merging needs float weights (decode quantized ones first)");
                problems.push(AdapterProblem::Unusable { module: name.to_string(), reason });
                return Ok(None);
            }
            if !problems.is_empty() {
                return Ok(None);
            }
            let weight = match replaced.get(name) {
                Some(saved) => saved.clone(),
                None => base.try_get(name)?,
            };
            weight.check_expansion(weight.expansion_limit()).map_err(|error| Error::Data {
                path: PathBuf::from(base.origin()),
                name: name.to_string(),
                source: Box::new(error),
            })?;
            Ok(Some(match change {
                Change::Add { delta, magnitude } => add_delta(&weight, &delta, magnitude.as_ref())?,
                Change::Module { module, magnitude, .. } => {
                    add_delta(&weight, &self.modules[module].delta()?, magnitude.as_ref())?
                }
                Change::Replace(tensor) => tensor.to_dtype(dtype)?,
            }))
        };
        let mut values = Vec::new();
        for (index, module) in self.modules.iter().enumerate() {
            if let Some(problem) = module_problem(module) {
                problems.push(problem);
                continue;
            }
            let (weight, magnitude) = (format!("{}.weight", module.source), module.magnitude.clone());
            if let Some(streams) = affine_streams(base, &module.source)? {
                match merge_affine(base, &module.source, streams, module)? {
                    Ok(entries) => values.extend(entries.into_iter().map(|(name, tensor)| (name, Some(tensor)))),
                    Err(problem) => problems.push(problem),
                }
                continue;
            }
            let change = Change::Module { module: index, ops: Vec::new(), magnitude };
            values.push((weight.clone(), merge(&weight, change, &mut problems)?));
            if let Some(bias) = &module.bias {
                let delta = scaled(bias, module.scale)?;
                let name = format!("{}.bias", module.source);
                let value = match (base.contains(&name), base.entry_spec(&weight)?) {
                    // A layer without a bias gets the trained one, as PEFT's merge gives it one.
                    (false, Some((dtype, _))) if dtype.is_castable_float() => {
                        // One value per output, as `B` has rows.
                        let rows = module.b.shape()[0];
                        if delta.shape() == [rows] {
                            Some(delta.to_dtype(dtype)?)
                        } else {
                            let (module, target, found) = (name.clone(), name.clone(), delta.shape().to_vec());
                            problems.push(AdapterProblem::Shape { module, target, expected: vec![rows], found });
                            None
                        }
                    }
                    _ => merge(&name, Change::Add { delta, magnitude: None }, &mut problems)?,
                };
                values.push((name, value));
            }
        }
        for (name, tensor) in &replaced {
            if !values.iter().any(|(merged, _)| merged == name) {
                values.push((name.clone(), Some(tensor.clone())));
            }
        }
        if !problems.is_empty() {
            return Err(self.mismatch(base.origin().to_string(), &problems));
        }
        for (name, value) in values {
            if let Some(value) = value {
                merged.insert(name, value);
            }
        }
        Ok(merged)
    }

    /// This adapter under GGUF names (`blk.0.attn_q`), for merging into a GGUF file of
    /// `model`'s architecture: each module's transformers path is found in `model`'s walk and
    /// renamed to the GGUF source of the same model tensor, and `B`'s rows of q and k are put
    /// in llama.cpp's rotary pair order (their groups counted by `metadata`'s head counts), as
    /// llama.cpp's `convert_lora_to_gguf.py` does. A GGUF adapter is returned as it is.
    ///
    /// # Errors
    /// [`Error::AdapterMismatch`] for modules `model` does not have, or whose GGUF tensor the
    /// model reads split or transposed; [`Error::Adapter`] for a missing head count.
    pub fn renamed_for_gguf<M: Module + ?Sized>(&self, model: &M, metadata: &crate::gguf::Metadata) -> Result<Adapter> {
        if self.format == AdapterFormat::Gguf {
            return Ok(self.clone());
        }
        let mut paths: HashMap<String, String> = HashMap::new();
        for_each_entry_named(model, self.format.naming(), |slot, _| {
            paths.insert(slot.source.to_string(), slot.name.to_string());
        });
        // Each model tensor's GGUF source, operations and shape (of rows only when the model
        // keeps the tensor in ggml blocks, U8 `[rows, bytes]`).
        let mut gguf: HashMap<String, (String, Vec<ImportOp>, Vec<usize>, bool)> = HashMap::new();
        for_each_entry_named(model, Naming::Gguf, |slot, tensor| {
            let packed = tensor.dtype() == DType::U8;
            gguf.insert(
                slot.name.to_string(),
                (slot.source.to_string(), slot.ops.to_vec(), tensor.shape().to_vec(), packed),
            );
        });
        let mut problems = Vec::new();
        let mut renamed = self.in_model_layout(model);
        renamed.format = AdapterFormat::Gguf;
        renamed.saved.clear();
        for name in self.saved.keys() {
            let reason = "a saved module is merged under transformers names only";
            problems.push(AdapterProblem::Unusable { module: name.clone(), reason: reason.into() });
        }
        for module in &mut renamed.modules {
            let source = format!("{}.weight", module.source);
            let Some((target, ops, shape, packed)) = paths.get(&source).and_then(|path| gguf.get(path)) else {
                problems.push(no_target(&problems, &source, paths.keys().map(String::as_str)));
                continue;
            };
            if module.fan_in_fan_out || ops.iter().any(|op| matches!(op, ImportOp::Split(_) | ImportOp::Transpose)) {
                let reason = "the GGUF tensor is split or transposed on the way to the model";
                problems.push(AdapterProblem::Unusable { module: source, reason: reason.into() });
                continue;
            }
            if let Some(problem) = module_problem(module) {
                problems.push(problem);
                continue;
            }
            // The shapes before the rows of q and k are reordered by them.
            let found = module.delta_shape();
            let fits = if *packed { found.first() == shape.first() } else { found == *shape };
            if !fits {
                let (target, expected) = (target.clone(), shape.clone());
                problems.push(AdapterProblem::Shape { module: source, target, expected, found });
                continue;
            }
            for op in ops {
                if let ImportOp::RopePermute(key) = op {
                    let arch = metadata.architecture().unwrap_or_default();
                    let key = format!("{arch}.attention.{key}");
                    let heads = metadata.u64(&key).ok_or_else(|| {
                        problem(
                            &self.path,
                            &key,
                            "is missing from the base's metadata: it counts the rotary groups of q and k",
                        )
                    })?;
                    let rows = module.b.shape()[0];
                    match usize::try_from(heads) {
                        Ok(heads) if heads > 0 && rows.is_multiple_of(2 * heads) => {
                            module.b = crate::import::reorder_rope_rows(&module.b, heads, true)?;
                        }
                        _ => {
                            let reason = format!(
                                "its {rows} rows of `B` do not split into the base's {heads} rotary groups (`{key}`) of pairs: the adapter belongs to another model"
                            );
                            problems.push(AdapterProblem::Unusable { module: source.clone(), reason });
                        }
                    }
                }
            }
            module.source = target.strip_suffix(".weight").unwrap_or(target).to_string();
        }
        if !problems.is_empty() {
            return Err(self.mismatch(model_name::<M>(), &problems));
        }
        Ok(renamed)
    }

    /// The GGUF file `base` with this GGUF-named adapter merged in (see
    /// [`Adapter::renamed_for_gguf`] for others): each target decoded, `W + s B A` added (DoRA's
    /// magnitudes applied), and encoded again in its own ggml type, as llama.cpp's
    /// `llama-export-lora` does; every other tensor and the metadata as they are.
    ///
    /// # Errors
    /// [`Error::AdapterMismatch`] listing modules without a tensor or with another shape, trained
    /// biases and saved modules (GGUF merges carry neither); [`Error::GgmlUnsupported`] for a
    /// target in a type nnx does not encode.
    pub fn merge_gguf(&self, base: &Archive) -> Result<crate::gguf::GgufWriter> {
        let metadata = base.gguf_metadata().ok_or_else(|| {
            problem(
                &self.path,
                "",
                &format!("cannot be merged as GGUF into {}, which is not a GGUF file", base.origin()),
            )
        })?;
        let mut problems = Vec::new();
        let mut merged: HashMap<String, crate::gguf::GgmlTensor> = HashMap::new();
        let names: Vec<&str> = base.names().collect();
        for module in &self.modules {
            let name = format!("{}.weight", module.source);
            if module.bias.is_some() {
                let reason = "a trained bias is not merged into GGUF files (merge into the transformers folder)";
                problems.push(AdapterProblem::Unusable {
                    module: format!("{}.bias", module.source),
                    reason: reason.into(),
                });
            }
            if !base.contains(&name) {
                problems.push(no_target(&problems, &name, names.iter().copied()));
                continue;
            }
            if let Some(problem) = module_problem(module) {
                problems.push(problem);
                continue;
            }
            let stored = base.ggml(&name)?;
            // The delta is computed once it is known to have the stored tensor's shape, and
            // only while nothing is refused (then nothing is merged).
            let found = module.delta_shape();
            if found != stored.shape.as_slice() {
                let (target, expected) = (name.clone(), stored.shape.clone());
                problems.push(AdapterProblem::Shape { module: name, target, expected, found });
                continue;
            }
            if !problems.is_empty() {
                continue;
            }
            let delta = module.delta()?;
            let weight = stored.dequantize()?;
            let value = add_delta(&weight, &delta, module.magnitude.as_ref())?;
            merged.insert(name, crate::gguf::GgmlTensor::quantize(&value, stored.ty)?);
        }
        for name in self.saved.keys() {
            let reason = "a saved module is merged under transformers names only";
            problems.push(AdapterProblem::Unusable { module: name.clone(), reason: reason.into() });
        }
        if !problems.is_empty() {
            return Err(self.mismatch(base.origin().to_string(), &problems));
        }
        let mut writer = crate::gguf::GgufWriter::new();
        *writer.metadata_mut() = metadata.clone();
        // The writer aligns as it writes; the base's own alignment key would contradict it.
        writer.metadata_mut().remove("general.alignment");
        for name in base.names() {
            let tensor = match merged.remove(name) {
                Some(tensor) => tensor,
                None => base.ggml(name)?,
            };
            writer.add(name, tensor)?;
        }
        Ok(writer)
    }

    /// The factors of every module as `model` reads its weights, for applying the adapter at
    /// run time (`y = W x + s B (A x)`) instead of merging it: for each model weight a module
    /// reaches, `A` `[r, in]` and `B` `[out, r]` in the model's own layout (a split source cut
    /// down to the model's piece, a transposed one turned), its scale and trained bias.
    /// `stored_rope_rows`: the model keeps q and k in llama.cpp's rotary pair order (a GGUF
    /// file's, see `ImportOptions::with_stored_rope_rows`), as a GGUF adapter's factors are.
    ///
    /// # Errors
    /// [`Error::AdapterMismatch`] as for [`Adapter::merge_into`], and for modules that only
    /// merge: DoRA (its row norms need the merged weight), embeddings and saved modules.
    pub fn attachments<M: Module + ?Sized>(&self, model: &M, stored_rope_rows: bool) -> Result<Vec<Attachment>> {
        let adapter = self.in_model_layout(model);
        let mut report = adapter.check_with(model, stored_rope_rows);
        let mut by_source: HashMap<String, Vec<(String, Vec<ImportOp>)>> = HashMap::new();
        for_each_entry_named(model, self.format.naming(), |slot, _| {
            if slot.tie.is_none() {
                by_source.entry(slot.source.to_string()).or_default().push((slot.name.to_string(), slot.ops.to_vec()));
            }
        });
        let mut attachments = Vec::new();
        for module in &adapter.modules {
            let source = format!("{}.weight", module.source);
            let only_merges = match (module.kind, &module.magnitude) {
                (LoraKind::Lookup, _) => Some("an embedding's factors are merged, not applied at run time"),
                (_, Some(_)) => Some("DoRA normalises the merged weight's rows: merge it instead"),
                _ => None,
            };
            if let Some(reason) = only_merges {
                report.problems.push(AdapterProblem::Unusable { module: source, reason: reason.into() });
                continue;
            }
            if !report.problems.is_empty() {
                // Refused anyway: no factors are cut or turned.
                continue;
            }
            for (name, ops) in by_source.get(&source).into_iter().flatten() {
                match factors_through(module, ops, stored_rope_rows) {
                    Ok((a, b, bias)) => attachments.push(Attachment {
                        target: name.clone(),
                        module: module.source.clone(),
                        a,
                        b,
                        scale: module.scale,
                        bias,
                    }),
                    Err(reason) => report.problems.push(AdapterProblem::Unusable { module: source.clone(), reason }),
                }
            }
        }
        for name in self.saved.keys() {
            let reason = "a saved module replaces a weight, which only a merge does";
            report.problems.push(AdapterProblem::Unusable { module: name.clone(), reason: reason.into() });
        }
        if !report.problems.is_empty() {
            return Err(self.mismatch(model_name::<M>(), &report.problems));
        }
        Ok(attachments)
    }

    /// [`Adapter::check`], rotary rows taken as stored when `stored_rope_rows`.
    fn check_with<M: Module + ?Sized>(&self, model: &M, stored_rope_rows: bool) -> AdapterReport {
        let mut report = self.plan(model, true).0;
        if stored_rope_rows {
            report.problems.retain(|problem| !matches!(problem, AdapterProblem::Unusable { reason, .. } if reason.contains("rotary order")));
        }
        report.problems.retain(
            |problem| !matches!(problem, AdapterProblem::Unusable { reason, .. } if reason.contains("trained a bias")),
        );
        report
    }

    /// The report and, for every model tensor the adapter changes, how.
    /// `attach`: for run time, where a weight packed in ggml blocks (U8 rows) takes the
    /// factors beside it (its rows checked); a merge needs float weights.
    fn plan<M: Module + ?Sized>(&self, model: &M, attach: bool) -> (AdapterReport, BTreeMap<String, Vec<Change>>) {
        // Each source name with the model tensors read from it, their operations and shapes.
        let mut by_source: HashMap<String, Vec<Target>> = HashMap::new();
        let mut sources = Vec::new();
        for_each_entry_named(model, self.format.naming(), |slot, tensor| {
            if slot.tie.is_some() {
                return;
            }
            sources.push(slot.source.to_string());
            by_source.entry(slot.source.to_string()).or_default().push(Target {
                name: slot.name.to_string(),
                ops: slot.ops.to_vec(),
                shape: tensor.shape().to_vec(),
                packed: tensor.dtype() == DType::U8,
            });
        });
        let mut report = AdapterReport::default();
        let mut changes: BTreeMap<String, Vec<Change>> = BTreeMap::new();
        let unexpected = |report: &mut AdapterReport, name: &str| {
            let problem = no_target(&report.problems, name, sources.iter().map(String::as_str));
            report.problems.push(problem);
        };
        for (index, module) in self.modules.iter().enumerate() {
            let weight = format!("{}.weight", module.source);
            let Some(targets) = by_source.get(&weight) else {
                unexpected(&mut report, &weight);
                continue;
            };
            if let Some(problem) = module_problem(module) {
                report.problems.push(problem);
                continue;
            }
            // The shapes are checked on a meta delta; a merge computes it when it applies it.
            let delta = Tensor::meta(DType::F32, &module.delta_shape());
            if module.magnitude.is_some() && (targets.len() != 1 || !targets[0].ops.is_empty()) {
                let reason = "DoRA normalises whole rows of the stored weight, which this model splits or reorders";
                report.problems.push(AdapterProblem::Unusable { module: weight, reason: reason.to_string() });
                continue;
            }
            let mut deltas = vec![(weight, delta, module.magnitude.clone(), Some(index))];
            if let Some(bias) = &module.bias {
                match scaled(bias, module.scale) {
                    Ok(delta) => deltas.push((format!("{}.bias", module.source), delta, None, None)),
                    Err(error) => {
                        let module = format!("{}.bias", module.source);
                        report.problems.push(AdapterProblem::Unusable { module, reason: error.to_string() });
                    }
                }
            }
            for (source, delta, magnitude, lazy) in deltas {
                let Some(targets) = by_source.get(&source) else {
                    if source.ends_with(".bias") {
                        let reason = "the adapter trained a bias (`lora_bias`) for a layer that has none in this model: merge into the files with `Adapter::merge_archive` (`nnx lora merge`), which adds it, and load them into a model whose layer has a bias";
                        report.problems.push(AdapterProblem::Unusable { module: source, reason: reason.into() });
                    } else {
                        unexpected(&mut report, &source);
                    }
                    continue;
                };
                for target in targets {
                    let fits = |piece: &Tensor| match target.packed {
                        true => attach && piece.shape().first() == target.shape.first(),
                        false => piece.shape() == target.shape.as_slice(),
                    };
                    match through_ops(&delta, &target.ops) {
                        Ok(_) if target.packed && !attach => {
                            let reason = "the weight is stored in ggml blocks: merge into the file (`merge_gguf`, `nnx lora merge`) or apply the adapter at run time";
                            report
                                .problems
                                .push(AdapterProblem::Unusable { module: source.clone(), reason: reason.into() });
                        }
                        Ok(piece) if fits(&piece) => {
                            report.matched.push(target.name.clone());
                            let magnitude = magnitude.clone();
                            let change = match lazy {
                                Some(module) => Change::Module { module, ops: target.ops.clone(), magnitude },
                                None => Change::Add { delta: piece, magnitude },
                            };
                            changes.entry(target.name.clone()).or_default().push(change);
                        }
                        Ok(piece) => report.problems.push(AdapterProblem::Shape {
                            module: source.clone(),
                            target: target.name.clone(),
                            expected: target.shape.clone(),
                            found: piece.shape().to_vec(),
                        }),
                        Err(reason) => {
                            report.problems.push(AdapterProblem::Unusable { module: source.clone(), reason });
                        }
                    }
                }
            }
        }
        for (name, tensor) in &self.saved {
            match by_source.get(name).map(Vec::as_slice) {
                Some([target]) if target.ops.is_empty() && target.shape == tensor.shape() => {
                    report.replaced.push(target.name.clone());
                    changes.entry(target.name.clone()).or_default().insert(0, Change::Replace(tensor.clone()));
                }
                Some([target]) => report.problems.push(AdapterProblem::Shape {
                    module: name.clone(),
                    target: target.name.clone(),
                    expected: target.shape.clone(),
                    found: tensor.shape().to_vec(),
                }),
                _ => unexpected(&mut report, name),
            }
        }
        (report, changes)
    }
}

/// `M`'s type name without its path, for messages.
fn model_name<M: ?Sized>() -> String {
    nnx_core::__private::short_type_name(std::any::type_name::<M>()).to_string()
}

/// A model tensor read from a source entry, as the walk reports it.
struct Target {
    name: String,
    ops: Vec<ImportOp>,
    shape: Vec<usize>,
    /// Rows of ggml blocks (U8): only the row count is the delta's.
    packed: bool,
}

/// How a merge changes one model tensor.
enum Change {
    /// `W + delta`, then DoRA's row scaling when there is a magnitude.
    Add { delta: Tensor, magnitude: Option<Tensor> },
    /// As `Add`, with module `module`'s delta read through `ops`, computed when applied.
    Module { module: usize, ops: Vec<ImportOp>, magnitude: Option<Tensor> },
    /// A whole new value (a saved module).
    Replace(Tensor),
}

/// `module`'s factors as the model reads the weight through `ops`: `(A [r, in], B [out, r])`
/// with `B A` the model's piece of the delta. The source delta is `B A`, or its transpose with
/// `fan_in_fan_out`; a split cuts `B`'s rows or `A`'s columns, whichever holds that axis.
#[allow(clippy::type_complexity)]
fn factors_through(
    module: &LoraModule,
    ops: &[ImportOp],
    stored_rope_rows: bool,
) -> std::result::Result<(Tensor, Tensor, Option<Tensor>), String> {
    let fail = |error: Error| error.to_string();
    let (mut a, mut b, mut bias) = (module.a.clone(), module.b.clone(), module.bias.clone());
    // Whether the source tensor is `(B A)ᵀ` rather than `B A`.
    let mut transposed = module.fan_in_fan_out;
    for op in ops {
        match op {
            ImportOp::Split(split) => {
                let axis = if split.axis < 0 { 2 + split.axis } else { split.axis };
                // Axis 0 of `B A` is B's rows; axis 1 is A's columns.
                let rows_of_b = (axis == 0) != transposed;
                let (tensor, axis) = if rows_of_b { (&mut b, 0) } else { (&mut a, 1) };
                let piece = tensor.shape()[axis] / split.parts.max(1);
                *tensor = tensor.narrow(axis, split.index * piece, piece).map_err(fail)?.contiguous();
                // A trained bias has one value per output: B's rows.
                if rows_of_b && let Some(values) = &bias {
                    bias = Some(values.narrow(0, split.index * piece, piece).map_err(fail)?.contiguous());
                }
            }
            ImportOp::Transpose => transposed = !transposed,
            ImportOp::Offset(_) => {}
            ImportOp::RopePermute(_) if stored_rope_rows => {}
            ImportOp::RopePermute(key) => {
                return Err(format!(
                    "the model reorders this weight's rows from llama.cpp's rotary order (grouped by `{key}`): attach to a model that keeps them as stored"
                ));
            }
        }
    }
    if transposed {
        // The model's weight is `(B A)ᵀ = Aᵀ Bᵀ`: `Bᵀ` is its `A`, `Aᵀ` its `B`.
        return Ok((
            b.transpose(0, 1).map_err(fail)?.contiguous(),
            a.transpose(0, 1).map_err(fail)?.contiguous(),
            bias,
        ));
    }
    Ok((a, b, bias))
}

/// One adapter module's factors on one model weight, for applying at run time.
#[derive(Debug, Clone)]
pub struct Attachment {
    /// The model weight (`layers.0.attn.q.weight`).
    pub target: String,
    /// The adapter's module the factors come from, in its naming (`model.layers.0.self_attn.q_proj`).
    pub module: String,
    /// `A`, F32 `[r, in]` in the model's layout.
    pub a: Tensor,
    /// `B`, F32 `[out, r]` in the model's layout.
    pub b: Tensor,
    /// The scale of `B (A x)`.
    pub scale: f32,
    /// A trained bias, added times the scale.
    pub bias: Option<Tensor>,
}

/// `delta` as the model reads its source entry: split pieces narrowed, transposes applied; or
/// why it cannot be.
fn through_ops(delta: &Tensor, ops: &[ImportOp]) -> std::result::Result<Tensor, String> {
    let mut tensor = delta.clone();
    for op in ops {
        tensor = match op {
            ImportOp::Split(split) => {
                let rank = tensor.rank() as isize;
                let axis = usize::try_from(if split.axis < 0 { rank + split.axis } else { split.axis }).unwrap_or(0);
                let piece = tensor.shape().get(axis).copied().unwrap_or(0) / split.parts.max(1);
                tensor.narrow(axis, split.index * piece, piece).map_err(|error| error.to_string())?
            }
            ImportOp::Transpose if tensor.rank() >= 2 => {
                let rank = tensor.rank();
                tensor.transpose(rank - 2, rank - 1).map_err(|error| error.to_string())?
            }
            ImportOp::Transpose => tensor,
            ImportOp::Offset(_) => tensor,
            ImportOp::RopePermute(key) => {
                return Err(format!(
                    "the model reorders this weight's rows from llama.cpp's rotary order (grouped by `{key}`), which a delta in transformers' order does not follow: merge into a model imported from transformers names"
                ));
            }
        };
    }
    Ok(if tensor.is_meta() { tensor } else { tensor.contiguous() })
}

/// The names of `stem`'s MLX affine streams (`weight` U32 with `scales` and `biases`), when
/// `base` stores it so.
fn affine_streams(base: &Archive, stem: &str) -> Result<Option<[String; 3]>> {
    let names = [format!("{stem}.weight"), format!("{stem}.scales"), format!("{stem}.biases")];
    let packed = matches!(base.entry_spec(&names[0])?, Some((DType::U32, _)));
    Ok((packed && base.contains(&names[1]) && base.contains(&names[2])).then_some(names))
}

/// `module` merged into the MLX affine weight `streams` of `base`, as `mlx_lm.fuse` does: the
/// weight decoded (in the scales' dtype), the delta cast to that dtype and added, and the sum
/// quantized again with the same bits and group size (inferred from the streams' shapes and
/// the delta's width). The three new streams, or the problem.
#[allow(clippy::type_complexity)]
fn merge_affine(
    base: &Archive,
    stem: &str,
    streams: [String; 3],
    module: &LoraModule,
) -> Result<std::result::Result<Vec<(String, Tensor)>, AdapterProblem>> {
    let [weight, scales, biases] = streams;
    let (packed, groups) = (base.try_get(&weight)?, base.try_get(&scales)?);
    // Everything is checked on the delta's shape; the delta is computed last.
    let delta_shape = module.delta_shape();
    let (columns, words, count) =
        (delta_shape[1], packed.shape().get(1).copied().unwrap_or(0), groups.shape().get(1).copied().unwrap_or(0));
    let bits = words.checked_mul(32).and_then(|bits| bits.checked_div(columns)).map(u32::try_from);
    let spec = match (bits, columns.checked_div(count)) {
        (Some(Ok(bits)), Some(group)) if packed.rank() == 2 && groups.rank() == 2 && columns % count == 0 => {
            nnx_core::quant::AffineSpec::new(bits, group)
        }
        _ => {
            let reason =
                format!("{delta_shape:?} does not fit its packed weight of {words} words with {count} groups a row");
            return Ok(Err(AdapterProblem::Unusable { module: weight, reason }));
        }
    };
    let affine =
        match spec.and_then(|spec| nnx_core::quant::AffineWeight::new(packed, groups, base.try_get(&biases)?, spec)) {
            Ok(affine) if affine.shape() == delta_shape => affine,
            Ok(affine) => {
                let (target, expected, found) = (weight.clone(), affine.shape(), delta_shape);
                return Ok(Err(AdapterProblem::Shape { module: weight, target, expected, found }));
            }
            Err(error) => return Ok(Err(AdapterProblem::Unusable { module: weight, reason: error.to_string() })),
        };
    if module.magnitude.is_some() || module.bias.is_some() {
        let reason = "DoRA magnitudes and trained biases are not merged into quantized weights";
        return Ok(Err(AdapterProblem::Unusable { module: format!("{stem}.weight"), reason: reason.into() }));
    }
    let delta = module.delta()?;
    let dtype = affine.dtype();
    let sum = add_delta(&affine.dequantize()?, &delta.to_dtype(dtype)?.to_dtype(DType::F32)?, None)?;
    let fused = nnx_core::quant::AffineWeight::quantize(&sum, affine.spec())?;
    Ok(Ok(vec![(weight, fused.weight), (scales, fused.scales), (biases, fused.biases)]))
}

/// `tensor * scale` in f32 (a trained bias, read from the file whole).
fn scaled(tensor: &Tensor, scale: f32) -> Result<Tensor> {
    let values: Vec<f32> = tensor.to_dtype(DType::F32)?.to_vec::<f32>()?.into_iter().map(|v| v * scale).collect();
    Tensor::from_vec(values, tensor.shape())
}

/// `weight + delta` in f32, rows rescaled to `magnitude` (DoRA: `m / ||W + ΔW||` per row), in
/// the weight's dtype.
fn add_delta(weight: &Tensor, delta: &Tensor, magnitude: Option<&Tensor>) -> Result<Tensor> {
    // The common case in one pass and one allocation: each stored value widened, the delta
    // added and the sum rounded back, read straight from the (mapped) weight.
    // Both are as large as the weight honestly is (callers check a view from a file first).
    let weight_view = weight.contiguous_within(weight.expansion_limit())?;
    let delta_view = delta.contiguous_within(delta.expansion_limit())?;
    if magnitude.is_none()
        && let Some(deltas) = delta_view.as_slice::<f32>().ok().flatten()
    {
        macro_rules! added {
            ($ty:ty) => {
                if let Some(values) = weight_view.as_slice::<$ty>().ok().flatten() {
                    let sums: Vec<$ty> =
                        values.iter().zip(deltas).map(|(&w, &d)| <$ty>::from_f32(f32::from(w) + d)).collect();
                    return Tensor::from_vec(sums, weight.shape());
                }
            };
        }
        match weight.dtype() {
            DType::BF16 => added!(half::bf16),
            DType::F16 => added!(half::f16),
            DType::F32 => {
                if let Some(values) = weight_view.as_slice::<f32>().ok().flatten() {
                    let sums: Vec<f32> = values.iter().zip(deltas).map(|(&w, &d)| w + d).collect();
                    return Tensor::from_vec(sums, weight.shape());
                }
            }
            _ => {}
        }
    }
    let mut values = weight.to_dtype(DType::F32)?.to_vec::<f32>()?;
    for (value, d) in values.iter_mut().zip(delta.to_vec::<f32>()?) {
        *value += d;
    }
    if let Some(magnitude) = magnitude {
        let magnitude = magnitude.to_dtype(DType::F32)?.to_vec::<f32>()?;
        let width = values.len() / magnitude.len().max(1);
        for (row, m) in values.chunks_exact_mut(width.max(1)).zip(magnitude) {
            let norm = row.iter().map(|&v| f64::from(v) * f64::from(v)).sum::<f64>().sqrt();
            let factor = (f64::from(m) / norm) as f32;
            row.iter_mut().for_each(|v| *v *= factor);
        }
    }
    Tensor::from_vec(values, weight.shape())?.to_dtype(weight.dtype())
}

/// A merge that can be taken back: the weights as they were before it.
#[derive(Debug)]
pub struct Merged {
    originals: Vec<(String, Tensor)>,
    /// What the merge matched and replaced.
    pub report: AdapterReport,
}

impl Merged {
    /// Puts back the weights the merge changed, bit for bit (the originals were kept, not
    /// recomputed, so the result does not depend on rounding).
    pub fn unmerge<M: Module + ?Sized>(self, model: &mut M) {
        let mut originals: HashMap<String, Tensor> = self.originals.into_iter().collect();
        for_each_entry_mut(model, |slot, tensor| {
            if let Some(original) = originals.remove(slot.name) {
                *tensor = original;
            }
        });
    }
}

/// What an adapter found in a model.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AdapterReport {
    /// Model tensors a module's delta (or trained bias) lands on, in adapter order.
    pub matched: Vec<String>,
    /// Model tensors a saved module replaces.
    pub replaced: Vec<String>,
    /// Everything that does not fit.
    pub problems: Vec<AdapterProblem>,
}

/// Why an adapter does not fit a model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdapterProblem {
    /// No model tensor is read from this source name.
    NoTarget {
        /// The adapter's source name (`model.layers.0.self_attn.q_proj.weight`).
        module: String,
        /// The model's closest source name, if one is close.
        suggestion: Option<String>,
    },
    /// The delta's shape is not the target's.
    Shape {
        /// The adapter's source name.
        module: String,
        /// The model tensor.
        target: String,
        /// The model tensor's shape.
        expected: Vec<usize>,
        /// The delta's shape as the model would read it.
        found: Vec<usize>,
    },
    /// A module that cannot be applied here.
    Unusable {
        /// The adapter's source name.
        module: String,
        /// Why.
        reason: String,
    },
}

impl std::fmt::Display for AdapterProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AdapterProblem::NoTarget { module, suggestion } => {
                write!(f, "`{module}` has no target in the model{}", nnx_core::error::DidYouMean(suggestion.as_deref()))
            }
            AdapterProblem::Shape { module, target, expected, found } => {
                write!(f, "`{module}` gives `{target}` a delta of {found:?}, but it is {expected:?}")
            }
            AdapterProblem::Unusable { module, reason } => write!(f, "`{module}`: {reason}"),
        }
    }
}

/// An [`Error::Adapter`] for `entry` of `path`.
/// An [`Error::Adapter`] for `entry` of `path`.
fn problem(path: &Path, entry: &str, problem: &str) -> Error {
    Error::Adapter { path: path.to_path_buf(), entry: entry.to_string(), problem: problem.to_string() }
}

/// Problems past this many are counted, not listed, and get no suggestion (the costly part of
/// a missing target): an adapter for another model can name thousands of modules.
const LISTED_PROBLEMS: usize = 20;

/// The problem of `module`, which nothing in the model or file is read from, with the nearest
/// of `candidates` while few problems are listed.
fn no_target<'a>(
    problems: &[AdapterProblem],
    module: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> AdapterProblem {
    let suggestion =
        if problems.len() < LISTED_PROBLEMS { nnx_core::__private::suggest(module, candidates) } else { None };
    AdapterProblem::NoTarget { module: module.to_string(), suggestion }
}

/// What is wrong with `module` whatever it is merged into: a scale that is not a finite number
/// (an overflowing `--lora ADAPTER:SCALE`), or DoRA magnitudes that are not one per output row.
fn module_problem(module: &LoraModule) -> Option<AdapterProblem> {
    let source = format!("{}.weight", module.source);
    if !module.scale.is_finite() {
        let reason = format!("its scale is {}, not a finite number: give a smaller multiplier", module.scale);
        return Some(AdapterProblem::Unusable { module: source, reason });
    }
    let rows = module.b.shape()[0];
    if let Some(magnitude) = &module.magnitude
        && magnitude.shape() != [rows]
    {
        let reason = format!(
            "its DoRA magnitude is {:?}, expected one value per output row ([{rows}]): the file is damaged",
            magnitude.shape()
        );
        return Some(AdapterProblem::Unusable { module: source, reason });
    }
    None
}

/// `name`'s tensor from `path` as F32 on the host, owned and contiguous. A factor must be a
/// float whose values are all in the file: a view that repeats a few stored bytes into
/// gigabytes (a zero stride, which a `torch.save` checkpoint can describe) is refused before
/// anything is copied.
fn f32_of(path: &Path, name: &str, tensor: Tensor) -> Result<Tensor> {
    if !tensor.dtype().is_castable_float() {
        return Err(problem(
            path,
            name,
            &format!(
                "is {}: LoRA factors and saved modules are floats (F32, F16, BF16); the file is damaged or not an adapter",
                tensor.dtype()
            ),
        ));
    }
    let limit = tensor.expansion_limit();
    if tensor.check_expansion(limit).is_err() {
        return Err(problem(
            path,
            name,
            &format!(
                "is a view of shape {:?} that repeats the {} bytes it is stored in into {} bytes: an adapter stores each factor whole; save it again (PEFT's `save_pretrained`)",
                tensor.shape(),
                tensor.stored_bytes(),
                tensor.byte_len()
            ),
        ));
    }
    tensor.to_dtype(DType::F32)?.contiguous_within(limit)
}

/// A JSON value as an error quotes it: numbers and booleans as written, a string shortened,
/// anything larger by its kind.
fn describe(value: &Value) -> String {
    match value {
        Value::Null => "null".into(),
        Value::Bool(_) | Value::Number(_) => value.to_string(),
        Value::String(text) => format!("the string `{}`", shown(text)),
        Value::Array(_) => "an array".into(),
        Value::Object(_) => "an object".into(),
    }
}

/// `text` as an error quotes it: printable, and cut after 80 characters.
fn shown(text: &str) -> String {
    let printable = nnx_core::text::printable(text);
    match printable.char_indices().nth(80) {
        Some((end, _)) => format!("{}...", &printable[..end]),
        None => printable.into_owned(),
    }
}

/// The number `key` of the config at `path`, `None` when absent, an error unless finite.
fn config_number(path: &Path, config: &Value, key: &str) -> Result<Option<f64>> {
    match config.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(value) => match value.as_f64() {
            Some(number) if number.is_finite() => Ok(Some(number)),
            _ => Err(problem(path, key, &format!("is {}, expected a finite number", describe(value)))),
        },
    }
}

/// A rank as a config gives it: a whole number of at least 1 (JSON may write it `8.0`).
fn whole_rank(value: &Value) -> Option<usize> {
    let number = value.as_f64()?;
    (number >= 1.0 && number.fract() == 0.0 && number <= u32::MAX as f64).then_some(number as usize)
}

/// The most bytes one `rank_pattern` or `alpha_pattern` key may compile to (and its matcher's
/// cache take): module patterns are short, and a key that repeats groups into megabytes is a
/// hostile config, which compiled once per module used to take minutes.
const PATTERN_BYTES: usize = 1 << 18;

/// How deeply a pattern key may nest groups and repetitions.
const PATTERN_NESTING: u32 = 32;

/// The most keys of one pattern map compiled as regular expressions (plain module paths, the
/// usual keys, are matched without compiling anything).
const PATTERN_REGEXES: usize = 256;

/// One key of PEFT's `rank_pattern` or `alpha_pattern`, matched as PEFT matches it: the key is
/// a regular expression for the module's whole path or its last dotted parts,
/// `^(.*\.)?(key)$`.
enum PatternKey {
    /// A key of plain characters, `.` (any character but a newline, `None`) and escaped
    /// punctuation (`model.layers.0.mlp.down_proj`, `model\.layers\.0\.q_proj`, `down_proj`):
    /// it matches a fixed number of characters at the end, so no regex engine is needed.
    Plain(Vec<Option<char>>),
    /// Any other regular expression, compiled once within [`PATTERN_BYTES`].
    Regex(regex::Regex),
}

impl PatternKey {
    /// The key as a [`PatternKey::Plain`], when it is one.
    fn plain(key: &str) -> Option<Vec<Option<char>>> {
        let mut pattern = Vec::new();
        let mut chars = key.chars();
        while let Some(c) = chars.next() {
            match c {
                '.' => pattern.push(None),
                // `\<` and `\>` are word boundaries, not characters.
                '\\' => match chars.next() {
                    Some(escaped) if escaped.is_ascii_punctuation() && !matches!(escaped, '<' | '>') => {
                        pattern.push(Some(escaped));
                    }
                    _ => return None,
                },
                c if c.is_alphanumeric() || c == '_' || c == '-' => pattern.push(Some(c)),
                _ => return None,
            }
        }
        Some(pattern)
    }

    fn matches(&self, module: &str) -> bool {
        match self {
            PatternKey::Regex(regex) => regex.is_match(module),
            PatternKey::Plain(pattern) => {
                let chars: Vec<char> = module.chars().collect();
                let Some(start) = chars.len().checked_sub(pattern.len()) else { return false };
                let tail = pattern
                    .iter()
                    .zip(&chars[start..])
                    .all(|(want, &found)| want.map_or(found != '\n', |want| want == found));
                // Before the key: nothing, or `.*\.` (a dot, and no newline before it).
                tail && (start == 0 || (chars[start - 1] == '.' && !chars[..start - 1].contains(&'\n')))
            }
        }
    }
}

/// PEFT's per-module `rank_pattern` or `alpha_pattern`: each key compiled once, with its value;
/// the first key (in the config's order) that matches a module gives its value.
struct Patterns {
    keys: Vec<(PatternKey, f64)>,
}

impl Patterns {
    /// The map `field` of the config at `path` (none when absent). `rank_pattern` values are
    /// ranks (whole numbers of at least 1), `alpha_pattern` values finite numbers.
    ///
    /// # Errors
    /// [`Error::Adapter`] naming the config and `field` for a value of another kind, a key that
    /// is not a regular expression or compiles past [`PATTERN_BYTES`], and more than
    /// [`PATTERN_REGEXES`] keys that need compiling.
    fn read(path: &Path, config: &Value, field: &str) -> Result<Patterns> {
        let entries = match config.get(field) {
            None | Some(Value::Null) => return Ok(Patterns { keys: Vec::new() }),
            Some(Value::Object(entries)) => entries,
            Some(other) => {
                let found = describe(other);
                return Err(problem(
                    path,
                    field,
                    &format!("is {found}, expected an object of module patterns and values"),
                ));
            }
        };
        let mut regexes = 0;
        let mut keys = Vec::with_capacity(entries.len());
        for (key, value) in entries {
            let number = match field {
                "rank_pattern" => whole_rank(value).map(|rank| rank as f64),
                _ => value.as_f64().filter(|alpha| alpha.is_finite()),
            };
            let Some(number) = number else {
                let expected = if field == "rank_pattern" { "a whole number of at least 1" } else { "a finite number" };
                return Err(problem(
                    path,
                    field,
                    &format!("gives key `{}` {}, expected {expected}", shown(key), describe(value)),
                ));
            };
            if let Some(pattern) = PatternKey::plain(key) {
                keys.push((PatternKey::Plain(pattern), number));
                continue;
            }
            regexes += 1;
            if regexes > PATTERN_REGEXES {
                return Err(problem(
                    path,
                    field,
                    &format!(
                        "has more than {PATTERN_REGEXES} keys that are regular expressions: name the modules by their paths, or merge keys into fewer expressions"
                    ),
                ));
            }
            let regex = regex::RegexBuilder::new(&format!(r"^(.*\.)?({key})$"))
                .size_limit(PATTERN_BYTES)
                .dfa_size_limit(PATTERN_BYTES)
                .nest_limit(PATTERN_NESTING)
                .build()
                .map_err(|error| {
                    let why = match error {
                        regex::Error::CompiledTooBig(limit) => format!("it compiles to more than {limit} bytes"),
                        // A syntax error's last line says what is wrong, after a picture of
                        // where; one line is kept.
                        other => {
                            let text = other.to_string();
                            let last = text.lines().next_back().unwrap_or_default();
                            shown(last.trim().trim_start_matches("error: "))
                        }
                    };
                    problem(
                        path,
                        field,
                        &format!(
                            "key `{}` is not a usable regular expression ({why}): give the module's path, or a short expression of at most {PATTERN_NESTING} nested groups",
                            shown(key)
                        ),
                    )
                })?;
            keys.push((PatternKey::Regex(regex), number));
        }
        Ok(Patterns { keys })
    }

    /// The value of the first key that matches `module`.
    fn value(&self, module: &str) -> Option<f64> {
        self.keys.iter().find(|(key, _)| key.matches(module)).map(|&(_, value)| value)
    }
}

/// The rank `r` of the factors `A` `[r, in]` and `B` `[out, r]` read from `path`, or the error
/// naming both entries when they are not such a pair (a rank of 0 included).
fn factor_rank(path: &Path, (a_name, a): (&str, &Tensor), (b_name, b): (&str, &Tensor)) -> Result<usize> {
    let r = a.shape().first().copied().unwrap_or(0);
    if a.rank() != 2 || b.rank() != 2 || b.shape()[1] != r || r == 0 {
        return Err(problem(
            path,
            b_name,
            &format!(
                "is {:?} beside `{a_name}` {:?}: expected `A` [r, in] and `B` [out, r] of the same rank r of at least 1",
                b.shape(),
                a.shape()
            ),
        ));
    }
    Ok(r)
}

/// A PEFT folder.
fn read_peft(dir: &Path, config: Value) -> Result<Adapter> {
    let config_path = dir.join("adapter_config.json");
    if let Some(kind) = config.get("peft_type").and_then(Value::as_str)
        && kind != "LORA"
    {
        return Err(problem(
            &config_path,
            "peft_type",
            &format!("is `{}`; nnx reads LoRA adapters (`LORA`, DoRA included)", shown(kind)),
        ));
    }
    // Every number the scales come from is checked, and every pattern compiled, before the
    // factors are read.
    let rank = match config.get("r") {
        None | Some(Value::Null) => 8,
        Some(value) => whole_rank(value).ok_or_else(|| {
            problem(
                &config_path,
                "r",
                &format!("is {}, expected the factors' rank, a whole number of at least 1", describe(value)),
            )
        })?,
    };
    let alpha = config_number(&config_path, &config, "lora_alpha")?.unwrap_or(8.0);
    let rank_patterns = Patterns::read(&config_path, &config, "rank_pattern")?;
    let alpha_patterns = Patterns::read(&config_path, &config, "alpha_pattern")?;
    let file = ["adapter_model.safetensors", "adapter_model.bin"]
        .iter()
        .map(|name| dir.join(name))
        .find(|path| path.is_file())
        .ok_or_else(|| {
            problem(
                dir,
                "adapter_model.safetensors",
                "is missing (nor is there `adapter_model.bin`): PEFT's `save_pretrained` writes it",
            )
        })?;
    let archive = Archive::open(&file)?;
    let flag = |key: &str| config.get(key).and_then(Value::as_bool).unwrap_or(false);
    let (rslora, fan_in_fan_out) = (flag("use_rslora"), flag("fan_in_fan_out"));

    // Every entry by module path and role.
    #[derive(Default)]
    struct Parts {
        a: Option<(String, Tensor)>,
        b: Option<(String, Tensor)>,
        bias: Option<Tensor>,
        magnitude: Option<Tensor>,
        embedding: bool,
    }
    let mut parts: BTreeMap<String, Parts> = BTreeMap::new();
    let mut order = Vec::new();
    let mut saved = BTreeMap::new();
    for name in archive.names() {
        let Some(path) = name.strip_prefix(PEFT_PREFIX) else {
            return Err(problem(
                &file,
                name,
                &format!(
                    "does not start with `{PEFT_PREFIX}`, as PEFT names every entry: rename the entries or the adapter would match nothing"
                ),
            ));
        };
        let tensor = f32_of(&file, name, archive.try_get(name)?)?;
        let roles: [(&str, u8); 7] = [
            (".lora_A.weight", 0),
            (".lora_B.weight", 1),
            (".lora_B.bias", 2),
            (".lora_embedding_A", 3),
            (".lora_embedding_B", 4),
            (".lora_magnitude_vector.weight", 5),
            (".lora_magnitude_vector", 5),
        ];
        let Some((stem, role)) =
            roles.iter().find_map(|&(suffix, role)| path.strip_suffix(suffix).map(|stem| (stem, role)))
        else {
            // A whole module (`modules_to_save`) under its own name; PEFT also saves the weight
            // of an adapted embedding as `<path>.base_layer.weight`.
            let path = path.replace(".base_layer.", ".");
            saved.insert(path, tensor);
            continue;
        };
        if !parts.contains_key(stem) {
            order.push(stem.to_string());
        }
        let entry = parts.entry(stem.to_string()).or_default();
        match role {
            0 | 3 => entry.a = Some((name.to_string(), tensor)),
            1 | 4 => entry.b = Some((name.to_string(), tensor)),
            2 => entry.bias = Some(tensor),
            _ => entry.magnitude = Some(tensor),
        }
        entry.embedding |= role == 3 || role == 4;
    }
    let mut modules = Vec::with_capacity(order.len());
    for stem in order {
        let parts = parts.remove(&stem).expect("every stem has parts");
        let (Some((a_name, a)), Some((b_name, b))) = (parts.a, parts.b) else {
            return Err(problem(&file, &stem, "has only one of `lora_A` and `lora_B`: the file is incomplete"));
        };
        let r = factor_rank(&file, (&a_name, &a), (&b_name, &b))?;
        let configured = rank_patterns.value(&stem).map_or(rank, |value| value as usize);
        if configured != r {
            return Err(problem(
                &file,
                &a_name,
                &format!(
                    "has rank {r}, but the config gives this module r = {configured}: the config does not belong to these weights"
                ),
            ));
        }
        let alpha = alpha_patterns.value(&stem).unwrap_or(alpha);
        let scale = if rslora { alpha / (r as f64).sqrt() } else { alpha / r as f64 } as f32;
        if !scale.is_finite() {
            return Err(problem(
                &config_path,
                "lora_alpha",
                &format!(
                    "gives `{}` the scale {alpha} / {r}, past what f32 holds: the config is damaged",
                    shown(&stem)
                ),
            ));
        }
        let kind = if parts.embedding { LoraKind::Lookup } else { LoraKind::Projection };
        modules.push(LoraModule {
            source: stem,
            kind,
            a,
            b,
            scale,
            fan_in_fan_out: fan_in_fan_out && kind == LoraKind::Projection,
            magnitude: parts.magnitude,
            bias: parts.bias,
        });
    }
    Ok(Adapter { path: dir.to_path_buf(), format: AdapterFormat::Peft, modules, saved, config })
}

/// An MLX-LM folder.
fn read_mlx(dir: &Path, config: Value) -> Result<Adapter> {
    let config_path = dir.join("adapter_config.json");
    if let Some(kind) = config.get("fine_tune_type").and_then(Value::as_str)
        && kind != "lora"
    {
        let kind = shown(kind);
        return Err(problem(
            &config_path,
            "fine_tune_type",
            &format!("is `{kind}`; nnx reads MLX-LM's `lora` adapters (fuse a `{kind}` one with mlx_lm first)"),
        ));
    }
    let scale = match config_number(&config_path, &config["lora_parameters"], "scale") {
        Ok(scale) => scale.unwrap_or(20.0) as f32,
        Err(_) => {
            let found = describe(&config["lora_parameters"]["scale"]);
            return Err(problem(
                &config_path,
                "lora_parameters.scale",
                &format!("is {found}, expected a finite number"),
            ));
        }
    };
    if !scale.is_finite() {
        return Err(problem(&config_path, "lora_parameters.scale", "is past what f32 holds: the config is damaged"));
    }
    let file = dir.join("adapters.safetensors");
    let archive = Archive::open(&file)?;
    let mut stems: Vec<&str> = archive.names().filter_map(|name| name.strip_suffix(".lora_a")).collect();
    stems.sort_unstable();
    for name in archive.names() {
        if !name.ends_with(".lora_a") && !name.ends_with(".lora_b") {
            return Err(problem(
                &file,
                name,
                "is not a LoRA factor (`.lora_a` or `.lora_b`): nnx reads MLX-LM's LoRA layers",
            ));
        }
    }
    let mut modules = Vec::with_capacity(stems.len());
    for stem in stems {
        let a_name = format!("{stem}.lora_a");
        let b_name = format!("{stem}.lora_b");
        if !archive.contains(&b_name) {
            return Err(problem(&file, &a_name, &format!("has no `{b_name}` beside it: the file is incomplete")));
        }
        // MLX keeps `x @ lora_a @ lora_b`: `lora_a` [in, r], `lora_b` [r, out].
        let a = f32_of(&file, &a_name, archive.try_get(&a_name)?)?;
        let b = f32_of(&file, &b_name, archive.try_get(&b_name)?)?;
        if a.rank() != 2 || b.rank() != 2 || a.shape()[1] != b.shape()[0] || a.shape()[1] == 0 {
            return Err(problem(
                &file,
                &b_name,
                &format!(
                    "is {:?} beside `{a_name}` {:?}: expected [in, r] and [r, out] of the same rank r of at least 1",
                    b.shape(),
                    a.shape()
                ),
            ));
        }
        modules.push(LoraModule {
            source: stem.to_string(),
            kind: LoraKind::Projection,
            a: a.transpose(0, 1)?.contiguous(),
            b: b.transpose(0, 1)?.contiguous(),
            scale,
            // Set per model by `Adapter::in_model_layout`: MLX-LM's factors are in the model's
            // layout, whatever the checkpoint's.
            fan_in_fan_out: false,
            magnitude: None,
            bias: None,
        });
    }
    Ok(Adapter { path: dir.to_path_buf(), format: AdapterFormat::Mlx, modules, saved: BTreeMap::new(), config })
}

/// A GGUF LoRA file.
fn read_gguf(path: &Path) -> Result<Adapter> {
    let archive = Archive::open(path)?;
    let metadata = archive
        .gguf_metadata()
        .ok_or_else(|| problem(path, "", "is not a GGUF file: a GGUF LoRA holds `adapter.type = lora`"))?;
    match metadata.str("adapter.type") {
        Some("lora") => {}
        found => {
            return Err(problem(
                path,
                "adapter.type",
                &format!(
                    "is {:?}, expected \"lora\": convert the adapter with llama.cpp's `convert_lora_to_gguf.py`",
                    found.map(shown)
                ),
            ));
        }
    }
    // llama.cpp's converter writes FLOAT32; any finite number is taken, anything else refused
    // rather than read as "no alpha" (a scale of 1).
    let alpha = match metadata.get("adapter.lora.alpha") {
        None => 0.0,
        Some(value) => match value.as_f64() {
            Some(alpha) if alpha.is_finite() => alpha,
            found => {
                let found = found.map_or_else(|| "not a number".to_string(), |alpha| alpha.to_string());
                return Err(problem(
                    path,
                    "adapter.lora.alpha",
                    &format!(
                        "is {found} ({}), expected a finite number: llama.cpp's `convert_lora_to_gguf.py` writes `lora_alpha` as FLOAT32",
                        value.value_type().name()
                    ),
                ));
            }
        },
    };
    let mut config = serde_json::Map::new();
    for (key, value) in metadata.iter().filter(|(key, _)| key.starts_with("adapter.") || key.starts_with("general.")) {
        let value = value.as_f64().map(Value::from).or_else(|| value.as_str().map(Value::from)).unwrap_or(Value::Null);
        config.insert(key.to_string(), value);
    }
    for name in archive.names() {
        if !name.ends_with(".lora_a") && !name.ends_with(".lora_b") {
            return Err(problem(path, name, "is not a LoRA factor (`.lora_a` or `.lora_b`)"));
        }
    }
    let mut stems: Vec<&str> = archive.names().filter_map(|name| name.strip_suffix(".weight.lora_a")).collect();
    stems.sort_unstable();
    let mut modules = Vec::with_capacity(stems.len());
    for stem in stems {
        let a_name = format!("{stem}.weight.lora_a");
        let b_name = format!("{stem}.weight.lora_b");
        if !archive.contains(&b_name) {
            return Err(problem(path, &a_name, &format!("has no `{b_name}` beside it: the file is incomplete")));
        }
        let a = f32_of(path, &a_name, archive.ggml(&a_name)?.dequantize()?)?;
        let b = f32_of(path, &b_name, archive.ggml(&b_name)?.dequantize()?)?;
        let r = factor_rank(path, (&a_name, &a), (&b_name, &b))?;
        // llama.cpp scales by alpha / r, or by 1 when the file gives no alpha.
        let scale = if alpha == 0.0 { 1.0 } else { (alpha / r as f64) as f32 };
        if !scale.is_finite() {
            return Err(problem(path, "adapter.lora.alpha", &format!("is {alpha}, past what an f32 scale holds")));
        }
        modules.push(LoraModule {
            source: stem.to_string(),
            kind: LoraKind::Projection,
            a,
            b,
            scale,
            fan_in_fan_out: false,
            magnitude: None,
            bias: None,
        });
    }
    Ok(Adapter {
        path: path.to_path_buf(),
        format: AdapterFormat::Gguf,
        modules,
        saved: BTreeMap::new(),
        config: Value::Object(config),
    })
}
