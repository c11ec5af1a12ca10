//! What the loader asks of a decoder's model type, written once per type ([`Decoder`]), and
//! the loading steps written once for every decoder and device ([`LoadsOn`]): a decoder's meta
//! model is boxed as a [`DecoderModel`], which loads on the host and, with the `gpu` feature,
//! on a GPU.

use nnx_core::quant::ggml::{GgmlLinear, GgmlType};

use super::super::gemma3::Gemma3;
use super::super::gemma4::Gemma4;
use super::super::gpt_oss::GptOss;
use super::super::llama::Llama;
use super::super::lora::Lora;
use super::super::moe::Experts;
use super::super::qwen::Qwen;
use super::super::qwen35::Qwen35;
use super::super::{Affine, CausalLm, Dense, Ggml, MapWeights, Seed, TokenEmbedding};
use super::Files;
use super::device::{HostTarget, Target, attach_to, ggml_meta, pack_embedding, pack_experts};
use super::folder::{Kind, Stems};
use crate::{Archive, Device, Host, ImportOptions, Module, Naming, Result};

/// What differs between the decoders' model types (Llama, Qwen, Gemma 3) as the loader builds
/// them: the dense meta model is `Self`, its ggml form `Ggml<D>`; where a GGUF file's embedding,
/// rotary rows, head and run-time adapters go. Their forms over other weight kinds come from the
/// derive's [`MapWeights`].
pub(super) trait Decoder: Module + Clone + Sized + 'static {
    /// The model over ggml blocks on `D`.
    type Ggml<D: Device>;

    /// The token embedding.
    fn embed(&mut self) -> &mut TokenEmbedding;

    /// Makes q and k keep a GGUF file's rotary row order where the model's products can read
    /// them so (no reordered copy), and says whether it does.
    fn keep_stored_rope_rows(&mut self) -> bool {
        false
    }

    /// Makes the model read its weights as a GGUF file lays them out where that differs from
    /// transformers' beyond names and row orders (Qwen3.5's DeltaNet).
    fn keep_gguf_layout(&mut self) {}

    /// The stacks of experts; none in a dense decoder.
    fn experts(&mut self) -> Vec<ExpertStack<'_>> {
        Vec::new()
    }

    /// The output projection of the ggml form (`None`: tied to the embedding).
    fn head<D: Device>(model: &mut Self::Ggml<D>) -> &mut Option<GgmlLinear<D>>;

    /// The ggml form on the host with `adapters` applied at run time beside its blocks.
    fn attach(
        model: Self::Ggml<Host>,
        adapters: &[(crate::adapter::Adapter, f32)],
        metadata: &crate::gguf::Metadata,
    ) -> Result<Box<dyn CausalLm<Device = Host>>>;
}

/// A stack of experts as the loader fills it: from a GGUF file's stacked entry in place, or from
/// a transformers folder's tensors (one copy of each stack: the folder keeps the experts apart
/// or fused another way, the products read them stacked).
pub(super) struct ExpertStack<'a> {
    /// Its model path (`layers.0.moe.gate`).
    pub(super) path: String,
    /// Where a transformers folder keeps it.
    pub(super) source: StackSource,
    /// The stack.
    pub(super) experts: &'a mut Experts,
}

/// Where a transformers folder keeps a stack of experts.
pub(super) enum StackSource {
    /// One tensor per expert, `{}` standing for the expert (Qwen3-MoE).
    PerExpert(String),
    /// One tensor `[experts, in, out * parts]` stored input-major, this stack being every
    /// `parts`-th output column from `index` (gpt-oss interleaves gate and up), with its bias
    /// `{name}_bias` `[experts, out * parts]` cut alike.
    Fused { name: String, parts: usize, index: usize },
    /// One tensor `[experts, out, in]`, the stack as it is (Gemma 4's `experts.gate_up_proj`).
    Whole(String),
}

/// Makes each fused stack that a folder stores as MXFP4 pairs (`{name}_blocks`, `{name}_scales`,
/// as gpt-oss is published) a meta stack of ggml MXFP4 rows, which [`stacked_experts`] then
/// fills with the pairs' codes and exponents as they are.
fn pack_microscaled_experts<M: Decoder>(dense: &mut M, archive: &Archive) -> Result<()> {
    for stack in dense.experts() {
        if let StackSource::Fused { name, .. } = &stack.source
            && !archive.contains(name)
            && archive.contains(&format!("{name}_blocks"))
        {
            let [count, out, input] = stack.experts.dims();
            let bias = stack.experts.bias.take();
            *stack.experts = Experts { bias, ..Experts::packed_meta(count, out, input, GgmlType::MXFP4)? };
        }
    }
    Ok(())
}

/// The import options that build each stack of experts from a transformers folder, after
/// [`pack_microscaled_experts`].
fn stacked_experts<M: Decoder>(dense: &mut M, archive: &Archive) -> Result<ImportOptions> {
    pack_microscaled_experts(dense, archive)?;
    let mut options = ImportOptions::default();
    for stack in dense.experts() {
        let count = stack.experts.dims()[0];
        let weight = format!("{}.weight", stack.path);
        options = match stack.source {
            StackSource::PerExpert(pattern) => {
                let names: Vec<String> = (0..count).map(|at| pattern.replace("{}", &at.to_string())).collect();
                options.hook(weight, names.clone(), move |archive, context| {
                    let mut bytes = Vec::new();
                    for name in &names {
                        bytes.extend_from_slice(&archive.tensor(name, context.dtype, &context.shape[1..])?.to_bytes()?);
                    }
                    crate::Tensor::from_bytes(context.dtype, context.shape, &bytes)
                })
            }
            StackSource::Whole(name) => options.hook(weight, [name.clone()], move |archive, context| {
                archive
                    .tensor(&name, context.dtype, context.shape)
                    .or_else(|_| archive.float(&name, context.dtype, context.shape)?.to_dtype(context.dtype))
            }),
            StackSource::Fused { name, parts, index } => {
                let bias = format!("{name}_bias");
                let options = match stack.experts.ggml {
                    Some((_, input)) => microscaled_hook(options, weight, name, parts, index, input),
                    None => options.hook(weight, [name.clone()], move |archive, context| {
                        let &[experts, out, input] = context.shape else { unreachable!("a stack is 3-D") };
                        let source = archive.tensor(&name, context.dtype, &[experts, input, out * parts])?;
                        let values = source.to_dtype(crate::DType::F32)?.to_vec::<f32>()?;
                        let mut cut = Vec::with_capacity(experts * out * input);
                        for expert in values.chunks_exact(input * out * parts) {
                            for column in 0..out {
                                cut.extend((0..input).map(|row| expert[row * out * parts + column * parts + index]));
                            }
                        }
                        crate::Tensor::from_vec(cut, context.shape)?.to_dtype(context.dtype)
                    }),
                };
                match stack.experts.bias.is_some() {
                    true => options.hook(format!("{}.bias", stack.path), [bias.clone()], move |archive, context| {
                        let &[experts, out] = context.shape else { unreachable!("a stack's bias is 2-D") };
                        let source = archive.tensor(&bias, context.dtype, &[experts, out * parts])?;
                        let values = source.to_dtype(crate::DType::F32)?.to_vec::<f32>()?;
                        let cut: Vec<f32> = values.iter().skip(index).step_by(parts).copied().collect();
                        crate::Tensor::from_vec(cut, context.shape)?.to_dtype(context.dtype)
                    }),
                    false => options,
                }
            }
        };
    }
    Ok(options)
}

/// The hook that fills the MXFP4 stack `weight` (`[experts, out, row_bytes]`) from the pairs
/// `{name}_blocks` (`[experts, out * parts, input / 32, 16]`) and `{name}_scales`
/// (`[experts, out * parts, input / 32]`), taking every `parts`-th row from `index` (gpt-oss
/// interleaves gate and up rows): one copy, the codes and exponents kept.
fn microscaled_hook(
    options: ImportOptions,
    weight: String,
    name: String,
    parts: usize,
    index: usize,
    input: usize,
) -> ImportOptions {
    let (blocks, scales) = (format!("{name}_blocks"), format!("{name}_scales"));
    options.hook(weight, [blocks.clone(), scales.clone()], move |archive, context| {
        let &[experts, out, row_bytes] = context.shape else { unreachable!("a stack is 3-D") };
        let groups = input / 32;
        let codes = archive.tensor(&blocks, crate::DType::U8, &[experts, out * parts, groups, 16])?;
        let exponents = archive.tensor(&scales, crate::DType::U8, &[experts, out * parts, groups])?;
        let (codes, exponents) = (codes.to_bytes()?, exponents.to_bytes()?);
        let mut packed = vec![0u8; experts * out * row_bytes];
        for (row, target) in packed.chunks_exact_mut(row_bytes).enumerate() {
            let source = (row / out) * out * parts + (row % out) * parts + index;
            let codes = &codes[source * groups * 16..][..groups * 16];
            let exponents = &exponents[source * groups..][..groups];
            nnx_core::quant::ggml::mxfp4_from_pairs(codes, exponents, target)?;
        }
        crate::Tensor::from_bytes(crate::DType::U8, context.shape, &packed)
    })
}

/// Refuses a run-time adapter (on a GGUF file) that adapts a stack of experts: nnx applies
/// adapters beside a GGUF file's attention and dense projections, not its packed expert stacks
/// (`stems`: the model's GGUF names). A folder's per-expert weights take them merged.
fn refuse_expert_adapters<M: Decoder>(
    dense: &mut M,
    stems: &Stems,
    adapters: &[(crate::adapter::Adapter, f32)],
) -> Result<()> {
    for stack in dense.experts() {
        let gguf = stems.of(&stack.path);
        let folder = match &stack.source {
            StackSource::PerExpert(pattern) => pattern.split("{}").next().unwrap_or(pattern).to_string(),
            StackSource::Fused { name, .. } | StackSource::Whole(name) => name.clone(),
        };
        for (adapter, _) in adapters {
            let names = |module: &&crate::adapter::LoraModule| {
                let source = module.source.strip_prefix("base_model.model.").unwrap_or(&module.source);
                source.starts_with(&gguf) || source.starts_with(&folder)
            };
            if let Some(module) = adapter.modules.iter().find(names) {
                return Err(crate::Error::Adapter {
                    path: adapter.path.clone(),
                    entry: module.source.clone(),
                    problem: format!(
                        "adapts the experts `{}` of a GGUF file, whose stacks nnx runs packed and adapts only beside \
                         attention and dense projections: merge the adapter into the model's transformers folder \
                         (`nnx run FOLDER --lora ADAPTER` merges it into each expert's weights), or drop its expert modules",
                        stack.path
                    ),
                });
            }
        }
    }
    Ok(())
}

/// `model` (a decoder over ggml blocks) with `adapters` beside its projections, each a
/// [`Lora`] over the block layer; `stored_rope_rows` says whether its q and k keep the file's
/// rotary row order, which the adapters' rows then follow.
fn attach_lora<M>(
    model: M,
    adapters: &[(crate::adapter::Adapter, f32)],
    metadata: &crate::gguf::Metadata,
    stored_rope_rows: bool,
) -> Result<Box<dyn CausalLm<Device = Host>>>
where
    M: Module + MapWeights<Ggml, Lora<Ggml>>,
    M::Mapped: CausalLm<Device = Host> + 'static,
{
    let layers = attach_to(&model, adapters, metadata, stored_rope_rows)?;
    Ok(Box::new(model.map_weights_at("", &|path, layer| Ok(layers.layer(path, layer)))?))
}

impl Decoder for Llama {
    type Ggml<D: Device> = Llama<D, Ggml>;

    fn embed(&mut self) -> &mut TokenEmbedding {
        &mut self.embed
    }

    fn keep_stored_rope_rows(&mut self) -> bool {
        self.stored_rope_rows = true;
        true
    }

    fn head<D: Device>(model: &mut Self::Ggml<D>) -> &mut Option<GgmlLinear<D>> {
        &mut model.lm_head
    }

    fn attach(
        model: Self::Ggml<Host>,
        adapters: &[(crate::adapter::Adapter, f32)],
        metadata: &crate::gguf::Metadata,
    ) -> Result<Box<dyn CausalLm<Device = Host>>> {
        let stored = model.stored_rope_rows;
        attach_lora(model, adapters, metadata, stored)
    }
}

impl Decoder for Qwen {
    type Ggml<D: Device> = Qwen<D, Ggml>;

    fn embed(&mut self) -> &mut TokenEmbedding {
        &mut self.embed
    }

    fn experts(&mut self) -> Vec<ExpertStack<'_>> {
        let sparse = self.layers.iter_mut().enumerate().filter_map(|(at, layer)| Some((at, layer.moe.as_mut()?)));
        sparse.flat_map(|(at, moe)| per_expert_stacks(at, moe)).collect()
    }

    fn head<D: Device>(model: &mut Self::Ggml<D>) -> &mut Option<GgmlLinear<D>> {
        &mut model.lm_head
    }

    fn attach(
        model: Self::Ggml<Host>,
        adapters: &[(crate::adapter::Adapter, f32)],
        metadata: &crate::gguf::Metadata,
    ) -> Result<Box<dyn CausalLm<Device = Host>>> {
        attach_lora(model, adapters, metadata, false)
    }
}

impl Decoder for Gemma3 {
    type Ggml<D: Device> = Gemma3<D, Ggml>;

    fn embed(&mut self) -> &mut TokenEmbedding {
        &mut self.embed
    }

    fn head<D: Device>(model: &mut Self::Ggml<D>) -> &mut Option<GgmlLinear<D>> {
        &mut model.lm_head
    }

    fn attach(
        model: Self::Ggml<Host>,
        adapters: &[(crate::adapter::Adapter, f32)],
        metadata: &crate::gguf::Metadata,
    ) -> Result<Box<dyn CausalLm<Device = Host>>> {
        attach_lora(model, adapters, metadata, false)
    }
}

impl Decoder for GptOss {
    type Ggml<D: Device> = GptOss<D, Ggml>;

    fn embed(&mut self) -> &mut TokenEmbedding {
        &mut self.embed
    }

    fn experts(&mut self) -> Vec<ExpertStack<'_>> {
        let layers = self.layers.iter_mut().enumerate();
        layers
            .flat_map(|(at, layer)| {
                let mlp = &mut layer.mlp;
                let fused = |name: &str, parts, index| StackSource::Fused {
                    name: format!("model.layers.{at}.mlp.experts.{name}"),
                    parts,
                    index,
                };
                let sources = [fused("gate_up_proj", 2, 0), fused("gate_up_proj", 2, 1), fused("down_proj", 1, 0)];
                [("gate", &mut mlp.gate), ("up", &mut mlp.up), ("down", &mut mlp.down)].into_iter().zip(sources).map(
                    move |((name, experts), source)| ExpertStack {
                        path: format!("layers.{at}.mlp.{name}"),
                        source,
                        experts,
                    },
                )
            })
            .collect()
    }

    fn head<D: Device>(model: &mut Self::Ggml<D>) -> &mut Option<GgmlLinear<D>> {
        &mut model.lm_head
    }

    fn attach(
        model: Self::Ggml<Host>,
        adapters: &[(crate::adapter::Adapter, f32)],
        metadata: &crate::gguf::Metadata,
    ) -> Result<Box<dyn CausalLm<Device = Host>>> {
        attach_lora(model, adapters, metadata, false)
    }
}

impl Decoder for Qwen35 {
    type Ggml<D: Device> = Qwen35<D, Ggml>;

    fn embed(&mut self) -> &mut TokenEmbedding {
        &mut self.embed
    }

    fn keep_gguf_layout(&mut self) {
        self.gguf_layout = true;
    }

    fn experts(&mut self) -> Vec<ExpertStack<'_>> {
        let sparse = self.layers.iter_mut().enumerate().filter_map(|(at, layer)| Some((at, layer.moe.as_mut()?)));
        sparse.flat_map(|(at, moe)| per_expert_stacks(at, moe)).collect()
    }

    fn head<D: Device>(model: &mut Self::Ggml<D>) -> &mut Option<GgmlLinear<D>> {
        &mut model.lm_head
    }

    fn attach(
        model: Self::Ggml<Host>,
        adapters: &[(crate::adapter::Adapter, f32)],
        metadata: &crate::gguf::Metadata,
    ) -> Result<Box<dyn CausalLm<Device = Host>>> {
        attach_lora(model, adapters, metadata, false)
    }
}

impl Decoder for Gemma4 {
    type Ggml<D: Device> = Gemma4<D, Ggml>;

    fn embed(&mut self) -> &mut TokenEmbedding {
        &mut self.embed
    }

    fn experts(&mut self) -> Vec<ExpertStack<'_>> {
        let layers = self.layers.iter_mut().enumerate();
        let mut stacks = Vec::new();
        for (at, layer) in layers {
            let whole = |name: &str| StackSource::Whole(format!("model.layers.{at}.experts.{name}"));
            if let Some(experts) = layer.experts_gate_up.as_mut() {
                stacks.push(ExpertStack {
                    path: format!("layers.{at}.experts_gate_up"),
                    source: whole("gate_up_proj"),
                    experts,
                });
            }
            if let Some(experts) = layer.experts_down.as_mut() {
                stacks.push(ExpertStack {
                    path: format!("layers.{at}.experts_down"),
                    source: whole("down_proj"),
                    experts,
                });
            }
        }
        stacks
    }

    fn head<D: Device>(model: &mut Self::Ggml<D>) -> &mut Option<GgmlLinear<D>> {
        &mut model.lm_head
    }

    fn attach(
        model: Self::Ggml<Host>,
        adapters: &[(crate::adapter::Adapter, f32)],
        metadata: &crate::gguf::Metadata,
    ) -> Result<Box<dyn CausalLm<Device = Host>>> {
        attach_lora(model, adapters, metadata, false)
    }
}

/// The stacks of a SwiGLU mixture of experts at layer `at`, which a transformers folder keeps
/// one tensor per expert (`model.layers.{at}.mlp.experts.{e}.gate_proj.weight`, ...).
fn per_expert_stacks(at: usize, moe: &mut super::super::moe::Moe) -> [ExpertStack<'_>; 3] {
    [("gate", &mut moe.gate), ("up", &mut moe.up), ("down", &mut moe.down)].map(|(name, experts)| ExpertStack {
        path: format!("layers.{at}.moe.{name}"),
        source: StackSource::PerExpert(format!("model.layers.{at}.mlp.experts.{{}}.{name}_proj.weight")),
        experts,
    })
}

/// A decoder over MLX affine layers, on the host.
type AffineForm<M> = <M as MapWeights<Dense, Affine>>::Mapped;

/// A decoder over SEED layers, on the host.
type SeedForm<M> = <M as MapWeights<Dense, Seed>>::Mapped;

/// A decoder's loading steps onto the device of `T`, written once: implemented for every
/// [`Decoder`] whose forms place on that device, so that a boxed decoder loads on either.
pub(super) trait LoadsOn<D: Device, T: Target<D>> {
    /// The decoder over a GGUF file's blocks (its embedding packed where the target keeps it so,
    /// its q/k rows as stored where the model reads them so), with the files' run-time adapters.
    fn gguf(self: Box<Self>, files: &Files, target: &T) -> Result<Box<dyn CausalLm<Device = D>>>;

    /// The decoder over a folder's weights of `kind`.
    fn folder(self: Box<Self>, files: &Files, kind: Kind, target: &T) -> Result<Box<dyn CausalLm<Device = D>>>;
}

impl<M, D, T> LoadsOn<D, T> for M
where
    D: Device,
    T: Target<D>,
    M: Decoder + crate::Place<D> + MapWeights<Dense, Ggml, Mapped = M::Ggml<Host>>,
    M: MapWeights<Dense, Affine> + MapWeights<Dense, Seed>,
    M::Placed: Module<D> + CausalLm<Device = D> + 'static,
    M::Ggml<Host>: Module + crate::Place<D, Placed = M::Ggml<D>>,
    M::Ggml<D>: Module<D> + CausalLm<Device = D> + 'static,
    AffineForm<M>: Module + crate::Place<D>,
    <AffineForm<M> as crate::Place<D>>::Placed: Module<D> + CausalLm<Device = D> + 'static,
    SeedForm<M>: Module + crate::Place<D>,
    <SeedForm<M> as crate::Place<D>>::Placed: Module<D> + CausalLm<Device = D> + 'static,
    GgmlLinear: crate::Place<D, Placed = GgmlLinear<D>>,
{
    fn gguf(self: Box<Self>, files: &Files, target: &T) -> Result<Box<dyn CausalLm<Device = D>>> {
        let mut dense = *self;
        let archive = &files.archive;
        // The GGUF names, once: packing changes shapes, not names.
        let stems = Stems::new(&dense, Naming::Gguf);
        dense.keep_gguf_layout();
        pack_embedding::<D, T>(archive, dense.embed())?;
        pack_experts(archive, &stems, &mut dense)?;
        let options = match dense.keep_stored_rope_rows() {
            true => ImportOptions::default().with_stored_rope_rows(),
            false => ImportOptions::default(),
        };
        refuse_expert_adapters(&mut dense, &stems, &files.adapters)?;
        let ggml = MapWeights::<Dense, Ggml>::map_weights_at(&dense, "", &ggml_meta(archive, &stems))?;
        target.finish_ggml::<M>(ggml, archive, &options, &files.adapters)
    }

    fn folder(self: Box<Self>, files: &Files, kind: Kind, target: &T) -> Result<Box<dyn CausalLm<Device = D>>> {
        let mut dense = *self;
        let options = stacked_experts(&mut dense, &files.archive)?;
        files.assemble(
            dense,
            kind,
            &options,
            target,
            |dense, f| MapWeights::<Dense, Affine>::map_weights_at(dense, "", f),
            |dense, f| MapWeights::<Dense, Seed>::map_weights_at(dense, "", f),
        )
    }
}

/// [`LoadsOn`] a GPU, as a trait a [`DecoderModel`] can require whether the `gpu` feature is on
/// or not.
#[cfg(feature = "gpu")]
pub(super) trait OnGpu: LoadsOn<crate::Gpu, super::device::GpuTarget> {}

#[cfg(feature = "gpu")]
impl<M: LoadsOn<crate::Gpu, super::device::GpuTarget>> OnGpu for M {}

/// Without the `gpu` feature, nothing.
#[cfg(not(feature = "gpu"))]
pub(super) trait OnGpu {}

#[cfg(not(feature = "gpu"))]
impl<M> OnGpu for M {}

/// A decoder's meta model, boxed: it loads on every device, and the import plan and the
/// adapters ask it what it reads.
pub(super) trait DecoderModel: LoadsOn<Host, HostTarget> + OnGpu {
    /// The plan of importing the files into the dense model as it is.
    fn plan_dense(&self, archive: &Archive) -> Result<crate::ImportPlan>;

    /// The plan of importing a folder of `kind` into the model over its layers.
    fn plan_folder(&self, files: &Files, kind: Kind) -> Result<crate::ImportPlan>;

    /// `adapter` in the layout the model's files store its weights in.
    fn adapter_layout(&self, adapter: &crate::adapter::Adapter) -> crate::adapter::Adapter;

    /// `adapter` renamed to a GGUF file's names and q/k row order.
    fn gguf_adapter(
        &self,
        adapter: &crate::adapter::Adapter,
        metadata: &crate::gguf::Metadata,
    ) -> Result<crate::adapter::Adapter>;
}

impl<M> DecoderModel for M
where
    M: Decoder + LoadsOn<Host, HostTarget> + OnGpu + MapWeights<Dense, Affine> + MapWeights<Dense, Seed>,
    AffineForm<M>: Module,
    SeedForm<M>: Module,
{
    fn plan_dense(&self, archive: &Archive) -> Result<crate::ImportPlan> {
        match archive.gguf_metadata() {
            Some(_) => archive.import_plan(self, ""),
            None => {
                let mut dense = self.clone();
                let options = stacked_experts(&mut dense, archive)?;
                archive.import_plan_with(&dense, "", &options)
            }
        }
    }

    fn plan_folder(&self, files: &Files, kind: Kind) -> Result<crate::ImportPlan> {
        let mut dense = self.clone();
        let options = stacked_experts(&mut dense, &files.archive)?;
        files.plan_folder(
            &dense,
            kind,
            &options,
            |dense, f| MapWeights::<Dense, Affine>::map_weights_at(dense, "", f),
            |dense, f| MapWeights::<Dense, Seed>::map_weights_at(dense, "", f),
        )
    }

    fn adapter_layout(&self, adapter: &crate::adapter::Adapter) -> crate::adapter::Adapter {
        adapter.in_model_layout(self)
    }

    fn gguf_adapter(
        &self,
        adapter: &crate::adapter::Adapter,
        metadata: &crate::gguf::Metadata,
    ) -> Result<crate::adapter::Adapter> {
        adapter.renamed_for_gguf(self, metadata)
    }
}
