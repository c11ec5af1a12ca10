//! The devices a model loads onto ([`Target`]: the host, a GPU), and the steps of placing a
//! GGUF file's model there: its embedding packed or decoded, its projections as meta ggml
//! layers of the file's types, and LoRA adapters attached at run time.

use std::collections::HashMap;

use nnx_core::quant::ggml::{GgmlLinear, GgmlType};

use super::super::moe::Experts;
use super::super::{CausalLm, TokenEmbedding};
use super::decoder::Decoder;
use super::folder::Stems;
use crate::nn::Linear;
use crate::{Archive, DType, Device, Error, Host, ImportOptions, Module, Result, Tensor};

/// The device a model is imported onto: a meta model is placed there, then imported, so that
/// each weight goes to the device as it is read.
pub(super) trait Target<D: Device> {
    fn device(&self) -> &D;

    fn finish<M>(&self, model: M, archive: &Archive) -> Result<Box<dyn CausalLm<Device = D>>>
    where
        M: Module + crate::Place<D>,
        M::Placed: Module<D> + CausalLm<Device = D> + 'static,
    {
        self.finish_with(model, archive, &ImportOptions::default())
    }

    fn finish_with<M>(
        &self,
        model: M,
        archive: &Archive,
        options: &ImportOptions,
    ) -> Result<Box<dyn CausalLm<Device = D>>>
    where
        M: Module + crate::Place<D>,
        M::Placed: Module<D> + CausalLm<Device = D> + 'static,
    {
        let mut placed = model.place_with(&mut crate::Placer::new(self.device()))?;
        archive.import_into_with(&mut placed, "", options)?;
        Ok(Box::new(placed))
    }

    /// Whether the token embedding stays in the file's ggml blocks ([`TokenEmbedding`]): on
    /// the host a lookup decodes a row where it is mapped and a tied head multiplies the same
    /// blocks, so the table is neither copied nor widened. A GPU would read each looked-up row
    /// back, so there the table is decoded to f32 once and a tied head gets its own blocks.
    const PACKED_EMBEDDING: bool;

    /// [`Target::finish`] for a decoder of ggml layers: a GGUF file without `output.weight`
    /// ties the head to `token_embd.weight`. Without [`Target::PACKED_EMBEDDING`] the
    /// embedding is decoded to f32 for lookups and the head gets `token_embd`'s blocks, so that
    /// the largest product of a decoded token reads the packed rows either way. `adapters` are
    /// applied at run time ([`Target::attach`]).
    fn finish_ggml<M: Decoder>(
        &self,
        model: M::Ggml<Host>,
        archive: &Archive,
        options: &ImportOptions,
        adapters: &[(crate::adapter::Adapter, f32)],
    ) -> Result<Box<dyn CausalLm<Device = D>>>
    where
        M::Ggml<Host>: Module + crate::Place<D, Placed = M::Ggml<D>>,
        M::Ggml<D>: Module<D> + CausalLm<Device = D> + 'static,
        GgmlLinear: crate::Place<D, Placed = GgmlLinear<D>>,
    {
        let mut placed = crate::Place::place_with(&model, &mut crate::Placer::new(self.device()))?;
        archive.import_into_with(&mut placed, "", options)?;
        let slot = M::head(&mut placed);
        if slot.is_none() && !Self::PACKED_EMBEDDING {
            let embedding = archive.ggml("token_embd.weight")?;
            let (ty, shape) = (embedding.ty, embedding.shape.clone());
            let [vocab, hidden] = shape[..] else {
                return Err(Error::BadShape { op: "load", expected: "a token embedding of [vocab, hidden]", shape });
            };
            let row_bytes = embedding.data.shape()[0] / vocab.max(1);
            let layer: GgmlLinear = GgmlLinear::new(embedding.data.reshape(&[vocab, row_bytes])?, None, ty, hidden)?;
            *slot = Some(crate::Place::place_with(&layer, &mut crate::Placer::new(self.device()))?);
        }
        if !adapters.is_empty() {
            let metadata = archive.gguf_metadata().ok_or(Error::Meta { op: "load" })?;
            return self.attach::<M>(placed, adapters, metadata);
        }
        Ok(Box::new(placed))
    }

    /// `model` with LoRA `adapters` applied at run time ([`super::lora`]): on the host, each
    /// projection keeps its blocks and adds the adapters' low-rank products.
    fn attach<M: Decoder>(
        &self,
        model: M::Ggml<D>,
        adapters: &[(crate::adapter::Adapter, f32)],
        metadata: &crate::gguf::Metadata,
    ) -> Result<Box<dyn CausalLm<Device = D>>>;
}

/// The adapters for a GGUF model, each with its multiplier set: renamed to the file's names and
/// q/k row order where the model keeps them (`stored_rope_rows`).
pub(super) fn attach_to<M>(
    model: &M,
    adapters: &[(crate::adapter::Adapter, f32)],
    metadata: &crate::gguf::Metadata,
    stored_rope_rows: bool,
) -> Result<super::super::lora::LoraLayers>
where
    M: Module,
{
    let renamed: Vec<crate::adapter::Adapter> = adapters
        .iter()
        .map(
            |(adapter, _)| {
                if stored_rope_rows { adapter.renamed_for_gguf(model, metadata) } else { Ok(adapter.clone()) }
            },
        )
        .collect::<Result<_>>()?;
    let refs: Vec<&crate::adapter::Adapter> = renamed.iter().collect();
    let layers = super::super::lora::LoraLayers::new(model, &refs, stored_rope_rows)?;
    for (index, (_, scale)) in adapters.iter().enumerate() {
        layers.switches().set(index, *scale);
    }
    Ok(layers)
}

pub(super) struct HostTarget;

impl Target<Host> for HostTarget {
    const PACKED_EMBEDDING: bool = true;

    fn device(&self) -> &Host {
        &Host
    }

    fn attach<M: Decoder>(
        &self,
        model: M::Ggml<Host>,
        adapters: &[(crate::adapter::Adapter, f32)],
        metadata: &crate::gguf::Metadata,
    ) -> Result<Box<dyn CausalLm<Device = Host>>> {
        M::attach(model, adapters, metadata)
    }
}

#[cfg(feature = "gpu")]
pub(super) struct GpuTarget(pub(super) crate::Gpu);

#[cfg(feature = "gpu")]
impl Target<crate::Gpu> for GpuTarget {
    const PACKED_EMBEDDING: bool = false;

    fn device(&self) -> &crate::Gpu {
        &self.0
    }

    fn attach<M: Decoder>(
        &self,
        _: M::Ggml<crate::Gpu>,
        adapters: &[(crate::adapter::Adapter, f32)],
        _: &crate::gguf::Metadata,
    ) -> Result<Box<dyn CausalLm<Device = crate::Gpu>>> {
        let path = adapters.first().map(|(adapter, _)| adapter.path.clone()).unwrap_or_default();
        Err(Error::Adapter {
            path,
            entry: String::new(),
            problem: "is applied at run time on the host only: run with `--device cpu`, or write the merged model with `nnx lora merge` and run that on the GPU".into(),
        })
    }
}

/// Makes `embed` a meta table of `token_embd.weight`'s ggml blocks where the target keeps
/// them packed ([`Target::PACKED_EMBEDDING`]); the import then fills it with the file's bytes.
pub(super) fn pack_embedding<D: Device, T: Target<D>>(archive: &Archive, embed: &mut TokenEmbedding) -> Result<()> {
    if !T::PACKED_EMBEDDING {
        return Ok(());
    }
    let [vocab, hidden] = embed.weight.shape()[..] else { unreachable!("a token embedding is 2-D") };
    // A missing entry is named by the import.
    if let Some(ty) = archive.ggml_type("token_embd.weight") {
        *embed = TokenEmbedding::packed_meta(vocab, hidden, ty)?;
    }
    Ok(())
}

/// Makes each stack of experts of `dense` a meta stack of its GGUF entry's ggml blocks, which
/// the import then maps (on the host) or uploads (on a GPU): a token's product reads only its
/// experts' rows.
pub(super) fn pack_experts<M: Decoder>(archive: &Archive, stems: &Stems, dense: &mut M) -> Result<()> {
    for stack in dense.experts() {
        // A missing entry is named by the import.
        if let Some(ty) = archive.ggml_type(&format!("{}.weight", stems.of(&stack.path))) {
            let [count, out, input] = stack.experts.dims();
            let bias = stack.experts.bias.take();
            *stack.experts = Experts { bias, ..Experts::packed_meta(count, out, input, ty)? };
        }
    }
    Ok(())
}

/// For `map_weights`: the meta [`GgmlLinear`] of each dense projection, of the ggml type and
/// shape its GGUF entry has (`stems`: the model's GGUF names).
pub(super) fn ggml_meta<'a>(
    archive: &'a Archive,
    stems: &'a Stems,
) -> impl Fn(&str, &Linear) -> Result<GgmlLinear> + 'a {
    move |path: &str, linear: &Linear| {
        let source = format!("{}.weight", stems.of(path));
        let [out, features] = linear.weight.shape() else { unreachable!("a linear weight is 2-D") };
        // Every entry of a GGUF file has a ggml type; a missing one is named by the import.
        let ty = archive.ggml_type(&source).unwrap_or(GgmlType::F32);
        let row_bytes = ty.row_bytes(*features).ok_or(Error::GgmlRow {
            op: "load",
            ty: ty.name(),
            block_size: ty.block_size(),
            values: *features,
            bytes: 0,
        })?;
        let bias = linear.bias.as_ref().map(|_| Tensor::meta(DType::F32, &[*out]));
        GgmlLinear::new(Tensor::meta(DType::U8, &[*out, row_bytes]), bias, ty, *features)
    }
}

/// `ggml q8_0 (14), f32 (5)`: the types of a GGUF file's tensors, most common first.
pub(super) fn ggml_summary(archive: &Archive) -> String {
    let mut counts: HashMap<&'static str, usize> = HashMap::new();
    for name in archive.names() {
        if let Some(ty) = archive.ggml_type(name) {
            *counts.entry(ty.name()).or_default() += 1;
        }
    }
    let mut counts: Vec<(&str, usize)> = counts.into_iter().collect();
    counts.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    let parts: Vec<String> = counts.iter().map(|(ty, count)| format!("{} ({count})", ty.to_lowercase())).collect();
    format!("ggml {}", parts.join(", "))
}
