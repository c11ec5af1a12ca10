//! Mixture-of-experts feed-forward layers: a router picks each token's top-k experts and their
//! outputs are summed by the router's weights. The experts of a layer are stacked tensors
//! ([`Experts`]); from a GGUF file they are the file's packed blocks, mapped, so that a token
//! reads only its experts' rows, and a pass groups its tokens by expert so that each expert's
//! rows are read once per pass.

use nnx_core::quant::ggml::{GgmlLinear, GgmlType};
use rayon::prelude::*;

use super::{Dense, Project, Weights};
use crate::nn::{Init, Linear};
use crate::{Compute, DType, Device, Host, Module, Tensor};

/// One projection per expert, stacked on the first axis: float `[experts, out, in]`, or (from
/// a GGUF file, whose `ffn_*_exps` entries stack them so) the packed ggml rows
/// `U8 [experts, out, row_bytes]` exactly as the file stores them. An expert's product is a view
/// of its rows: nothing is copied, and an expert no token is routed to is never read.
#[derive(Module, Clone, Debug)]
pub struct Experts<D: Device = Host> {
    /// The stacked weights: float `[experts, out, in]`, or U8 `[experts, out, row_bytes]` when
    /// [`Self::ggml`] is set.
    pub weight: Tensor<D>,
    /// Each expert's bias, `[experts, out]` (gpt-oss).
    pub bias: Option<Tensor<D>>,
    /// The ggml type of the rows and their width in values, when the weights are packed.
    #[nnx(skip)]
    pub ggml: Option<(GgmlType, usize)>,
}

impl Experts {
    /// `experts` float projections of `input -> out`, each initialised as a [`Linear`] is.
    pub fn new(experts: usize, out: usize, input: usize, dtype: DType, init: Init) -> Experts {
        let weight = match init {
            Init::Meta => Tensor::meta(dtype, &[experts, out, input]),
            init => {
                let stacked = Linear::builder(input, experts * out).bias(false).dtype(dtype).init(init).build();
                stacked.weight.reshape(&[experts, out, input]).expect("the same number of values")
            }
        };
        Experts { weight, bias: None, ggml: None }
    }

    /// These experts with a zero bias each, in `dtype`.
    #[must_use]
    pub fn with_bias(mut self, dtype: DType) -> Experts {
        let [experts, out, _] = self.dims();
        self.bias = Some(match self.weight.is_meta() {
            true => Tensor::meta(dtype, &[experts, out]),
            false => Tensor::zeros(dtype, &[experts, out]),
        });
        self
    }

    /// A meta stack of `experts` projections of `input -> out` packed as `ty`, for importing the
    /// blocks of a GGUF entry as they are.
    ///
    /// # Errors
    /// [`Error::GgmlRow`](crate::Error::GgmlRow) when `input` is not a whole number of `ty`'s
    /// blocks.
    pub fn packed_meta(experts: usize, out: usize, input: usize, ty: GgmlType) -> crate::Result<Experts> {
        let row_bytes = ty.row_bytes(input).ok_or(crate::Error::GgmlRow {
            op: "Experts::packed_meta",
            ty: ty.name(),
            block_size: ty.block_size(),
            values: input,
            bytes: 0,
        })?;
        Ok(Experts { weight: Tensor::meta(DType::U8, &[experts, out, row_bytes]), bias: None, ggml: Some((ty, input)) })
    }

    /// `[experts, out, in]`: the shape of the float weights these stand for.
    pub fn dims(&self) -> [usize; 3] {
        let shape = self.weight.shape();
        [shape[0], shape[1], self.ggml.map_or(shape[2], |(_, input)| input)]
    }
}

impl<D: Device> Experts<D>
where
    Tensor<D>: Compute,
    GgmlLinear<D>: Project<D>,
{
    /// `x` `[rows, in]` through expert `expert`: `[rows, out]` in f32, reading that expert's
    /// rows of the stack in place.
    ///
    /// # Errors
    /// An expert past the stack, or a last axis of `x` that is not `in`.
    pub fn project(&self, expert: usize, x: &Tensor<D>) -> crate::Result<Tensor<D>> {
        let shape = self.weight.shape().to_vec();
        let one = Compute::reshape(&Compute::narrow(&self.weight, 0, expert, 1)?, &shape[1..])?;
        let bias = match &self.bias {
            Some(bias) => Some(Compute::reshape(&Compute::narrow(bias, 0, expert, 1)?, &[shape[1]])?),
            None => None,
        };
        match self.ggml {
            Some((ty, input)) => GgmlLinear::new(one, bias, ty, input)?.project(x),
            None => Compute::linear(x, &one, bias.as_ref()),
        }
    }
}

/// How a router's logits pick and weigh a token's experts.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Routing {
    /// Experts per token.
    pub top_k: usize,
    /// Whether the chosen experts' weights are divided by their sum (Qwen3-MoE's
    /// `norm_topk_prob`), rather than kept as the softmax over all experts gave them.
    pub normalize: bool,
}

impl Routing {
    /// The experts of one token and their weights, from its router `logits`: the softmax over
    /// every expert (in f32), its `top_k` largest (the lower index first on a tie), and their
    /// probabilities, normalized when [`Routing::normalize`] says.
    pub fn route(&self, logits: &[f32]) -> Vec<(usize, f32)> {
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let exps: Vec<f32> = logits.iter().map(|&logit| (logit - max).exp()).collect();
        let total: f32 = exps.iter().sum();
        let mut order: Vec<usize> = (0..logits.len()).collect();
        order.sort_by(|&a, &b| exps[b].total_cmp(&exps[a]).then(a.cmp(&b)));
        order.truncate(self.top_k);
        let chosen: f32 = order.iter().map(|&expert| exps[expert]).sum();
        let divisor = if self.normalize { chosen } else { total };
        order.into_iter().map(|expert| (expert, exps[expert] / divisor)).collect()
    }
}

/// A mixture-of-experts feed-forward network with SwiGLU experts (Qwen3-MoE):
/// `sum_k w_k * down_k(silu(gate_k(x)) * up_k(x))` over the experts the router picks.
#[derive(Module, Clone, Debug)]
pub struct Moe<D: Device = Host, W: Weights = Dense> {
    /// The router: `hidden -> experts` logits.
    #[nnx(from = "gate", gguf = "ffn_gate_inp")]
    pub router: W::Layer<D>,
    /// Gate projections, `hidden -> inner` each.
    #[nnx(gguf = "ffn_gate_exps")]
    pub gate: Experts<D>,
    /// Up projections, `hidden -> inner` each.
    #[nnx(gguf = "ffn_up_exps")]
    pub up: Experts<D>,
    /// Down projections, `inner -> hidden` each.
    #[nnx(gguf = "ffn_down_exps")]
    pub down: Experts<D>,
    /// How the router picks.
    #[nnx(skip)]
    pub routing: Routing,
}

impl Moe {
    /// `experts` experts of `hidden -> inner -> hidden` and their router, in `dtype`.
    pub fn new(hidden: usize, inner: usize, experts: usize, routing: Routing, dtype: DType, init: Init) -> Moe {
        Moe {
            router: Linear::builder(hidden, experts).bias(false).dtype(dtype).init(init.at("router")).build(),
            gate: Experts::new(experts, inner, hidden, dtype, init.at("gate")),
            up: Experts::new(experts, inner, hidden, dtype, init.at("up")),
            down: Experts::new(experts, hidden, inner, dtype, init.at("down")),
            routing,
        }
    }
}

impl<D: Device, W: Weights> Moe<D, W>
where
    Tensor<D>: Compute,
    W::Layer<D>: Project<D>,
    GgmlLinear<D>: Project<D>,
{
    /// The network on `x` `[rows, hidden]`: each row's experts picked by the router, the rows
    /// grouped by expert so that each expert runs once on all the rows routed to it, and the
    /// outputs summed by the router's weights in expert order; `[rows, hidden]` in f32.
    ///
    /// # Errors
    /// A last axis of `x` that is not `hidden`.
    pub fn forward(&self, x: &Tensor<D>) -> crate::Result<Tensor<D>> {
        let logits = Compute::to_f32_vec(&self.router.project(x)?)?;
        routed(&logits, x, [&self.gate, &self.up, &self.down], self.routing, Activation::Silu)
    }
}

/// How an expert joins its gate and up projections.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Activation {
    /// `silu(gate) * up` (Qwen3-MoE).
    Silu,
    /// gpt-oss's: `(clamp(up, -limit, limit) + 1) * g * sigmoid(alpha * g)` with
    /// `g = min(gate, limit)`.
    ClampedSwiglu {
        /// The sigmoid's slope (1.702).
        alpha: f32,
        /// The clamp (7).
        limit: f32,
    },
}

/// The experts' output for `x` `[rows, hidden]` given the router's `logits` (`[rows, experts]`,
/// row-major): each row's experts picked by `routing`, the rows grouped by expert so that each
/// expert runs once on all the rows routed to it, and the outputs summed by the router's
/// weights in expert order; `[rows, hidden]` in f32.
///
/// # Errors
/// A last axis of `x` that is not the experts' input width.
pub(crate) fn routed<'a, D: Device>(
    logits: &[f32],
    x: &Tensor<D>,
    [gate, up, down]: [&'a Experts<D>; 3],
    routing: Routing,
    activation: Activation,
) -> crate::Result<Tensor<D>>
where
    Tensor<D>: Compute,
    GgmlLinear<D>: Project<D>,
{
    let (rows, hidden) = (x.shape()[0], x.shape()[1]);
    let experts = gate.weight.shape()[0];
    // A decoded token on the host over packed stacks: one grouped product (D is `Host` there).
    if rows == 1 {
        let any = |experts: &'a Experts<D>| -> &'a dyn std::any::Any { experts };
        let [gate_host, up_host, down_host] = [gate, up, down].map(|stack| any(stack).downcast_ref::<Experts<Host>>());
        let x_host = (x as &dyn std::any::Any).downcast_ref::<Tensor<Host>>();
        if let (Some(gate), Some(up), Some(down), Some(x_host)) = (gate_host, up_host, down_host, x_host) {
            let values = x_host.to_dtype(DType::F32)?.to_vec::<f32>()?;
            if let Some(out) = one_token(&values, logits, [gate, up, down], routing, activation)? {
                let out: Box<dyn std::any::Any> = Box::new(Tensor::from_vec(out, &[1, hidden])?);
                return Ok(*out.downcast::<Tensor<D>>().expect("the host's tensor"));
            }
        }
    }
    let mut routed: Vec<Vec<(u32, f32)>> = vec![Vec::new(); experts];
    for (row, logits) in logits.chunks_exact(experts.max(1)).enumerate() {
        for (expert, weight) in routing.route(logits) {
            routed[expert].push((row as u32, weight));
        }
    }
    let x = Compute::to_dtype(x, DType::F32)?;
    let mut out = vec![0f32; rows * hidden];
    for (expert, tokens) in routed.iter().enumerate().filter(|(_, tokens)| !tokens.is_empty()) {
        let ids: Vec<u32> = tokens.iter().map(|&(row, _)| row).collect();
        let xs = if ids.len() == rows { x.clone() } else { Compute::embedding(&x, &ids)? };
        let (g, u) = (gate.project(expert, &xs)?, up.project(expert, &xs)?);
        let gated = match activation {
            Activation::Silu => g.silu()?.mul(&u)?,
            Activation::ClampedSwiglu { .. } => {
                let (shape, g, u) = (g.shape().to_vec(), Compute::to_f32_vec(&g)?, Compute::to_f32_vec(&u)?);
                let values = g.iter().zip(&u).map(|(&g, &u)| activation.apply(g, u)).collect();
                crate::Placer::new(x.device()).tensor(&Tensor::from_vec(values, &shape)?)?
            }
        };
        let down = Compute::to_f32_vec(&down.project(expert, &gated)?)?;
        for (&(row, weight), values) in tokens.iter().zip(down.chunks_exact(hidden)) {
            let sum = &mut out[row as usize * hidden..][..hidden];
            sum.iter_mut().zip(values).for_each(|(sum, value)| *sum += weight * value);
        }
    }
    crate::Placer::new(x.device()).tensor(&Tensor::from_vec(out, &[rows, hidden])?)
}

/// The bytes of expert `expert`'s rows of a packed stack on the host, with its type, rows
/// and columns; `None` for float or strided weights.
fn packed_rows(experts: &Experts<Host>, expert: usize) -> Option<(GgmlType, &[u8], usize, usize)> {
    let (ty, input) = experts.ggml?;
    let [_, out, row_bytes] = experts.weight.shape()[..] else { return None };
    let bytes = experts.weight.as_slice::<u8>().ok()??;
    Some((ty, &bytes[expert * out * row_bytes..][..out * row_bytes], out, input))
}

/// One token's experts on the host, over packed stacks: the gate and up rows of all its
/// experts in one parallel product with the input rounded once
/// ([`matvec_many`](nnx_core::quant::ggml::matvec_many)), then each expert's down product;
/// `None` when a stack is not packed in place (the general pass takes it).
fn one_token(
    x: &[f32],
    logits: &[f32],
    [gate, up, down]: [&Experts<Host>; 3],
    routing: Routing,
    activation: Activation,
) -> crate::Result<Option<Vec<f32>>> {
    let chosen = routing.route(logits);
    let mut weights = Vec::with_capacity(2 * chosen.len());
    for &(expert, _) in &chosen {
        for stack in [gate, up] {
            let Some((ty, bytes, out, input)) = packed_rows(stack, expert) else { return Ok(None) };
            if input != x.len() {
                return Ok(None);
            }
            weights.push((ty, bytes, out));
        }
    }
    let mut outputs: Vec<Vec<f32>> = weights.iter().map(|&(_, _, out)| vec![0f32; out]).collect();
    let mut slices: Vec<&mut [f32]> = outputs.iter_mut().map(Vec::as_mut_slice).collect();
    nnx_core::quant::ggml::matvec_many(&weights, x.len(), x, &mut slices)?;
    let bias = |stack: &Experts<Host>, expert: usize, values: &mut [f32]| -> crate::Result<()> {
        if let Some(bias) = &stack.bias {
            let row = bias.narrow(0, expert, 1)?.to_dtype(DType::F32)?.to_vec::<f32>()?;
            values.iter_mut().zip(row).for_each(|(value, bias)| *value += bias);
        }
        Ok(())
    };
    // The down products of the experts run side by side (each a few hundred rows, too small
    // to fill the threads alone), and are summed in expert order.
    let mut downs = Vec::with_capacity(chosen.len());
    for (&(expert, _), pair) in chosen.iter().zip(outputs.chunks_exact_mut(2)) {
        let [g, u] = pair else { unreachable!("gate and up") };
        bias(gate, expert, g)?;
        bias(up, expert, u)?;
        let gated: Vec<f32> = g.iter().zip(u.iter()).map(|(&g, &u)| activation.apply(g, u)).collect();
        let Some((ty, bytes, out, input)) = packed_rows(down, expert) else { return Ok(None) };
        if input != gated.len() || out != x.len() {
            return Ok(None);
        }
        downs.push((ty, bytes, out, gated));
    }
    let ys: Vec<crate::Result<Vec<f32>>> = downs
        .par_iter()
        .map(|(ty, bytes, out, gated)| {
            let mut y = vec![0f32; *out];
            nnx_core::quant::ggml::matvec(*ty, bytes, *out, gated.len(), gated, &mut y)?;
            Ok(y)
        })
        .collect();
    let mut sum = vec![0f32; x.len()];
    for (&(expert, weight), y) in chosen.iter().zip(ys) {
        let mut y: Vec<f32> = y?;
        bias(down, expert, &mut y)?;
        sum.iter_mut().zip(&y).for_each(|(sum, value)| *sum += weight * value);
    }
    Ok(Some(sum))
}

impl Activation {
    /// The joined value of one gate and one up output.
    fn apply(self, g: f32, u: f32) -> f32 {
        match self {
            Activation::Silu => g / (1.0 + (-g).exp()) * u,
            Activation::ClampedSwiglu { alpha, limit } => {
                let g = g.min(limit);
                (u.clamp(-limit, limit) + 1.0) * g / (1.0 + (-alpha * g).exp())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routing_picks_the_top_k_and_weighs_them_as_the_softmax_says() {
        let logits = [1.0f32, 3.0, 2.0, 3.0];
        let exps: Vec<f32> = logits.iter().map(|&logit| (logit - 3.0f32).exp()).collect();
        let total: f32 = exps.iter().sum();
        // A tie goes to the lower index, as the chosen pair is ordered.
        let normalized = Routing { top_k: 2, normalize: true }.route(&logits);
        assert_eq!(normalized, [(1, 0.5), (3, 0.5)]);
        let kept = Routing { top_k: 3, normalize: false }.route(&logits);
        assert_eq!(kept.iter().map(|&(expert, _)| expert).collect::<Vec<_>>(), [1, 3, 2]);
        assert!((kept[2].1 - exps[2] / total).abs() < 1e-7);
    }

    #[test]
    fn a_pass_equals_each_row_through_its_experts_alone() {
        let routing = Routing { top_k: 2, normalize: true };
        let moe = Moe::new(8, 6, 4, routing, DType::F32, Init::Seeded(5));
        let x = Tensor::from_vec((0..24).map(|at| (at as f32 * 0.37).sin()).collect::<Vec<_>>(), &[3, 8]).unwrap();
        let all = moe.forward(&x).unwrap().to_vec::<f32>().unwrap();
        for row in 0..3 {
            let one = moe.forward(&x.narrow(0, row, 1).unwrap().contiguous()).unwrap().to_vec::<f32>().unwrap();
            let logits = moe.router.forward(&x.narrow(0, row, 1).unwrap()).unwrap().to_vec::<f32>().unwrap();
            let mut expected = vec![0f32; 8];
            for (expert, weight) in routing.route(&logits) {
                let xs = x.narrow(0, row, 1).unwrap().contiguous();
                let gated =
                    moe.gate.project(expert, &xs).unwrap().silu().unwrap().mul(&moe.up.project(expert, &xs).unwrap());
                let down = moe.down.project(expert, &gated.unwrap()).unwrap().to_vec::<f32>().unwrap();
                expected.iter_mut().zip(down).for_each(|(sum, value)| *sum += weight * value);
            }
            for ((a, b), c) in all[row * 8..][..8].iter().zip(&one).zip(&expected) {
                assert!((a - b).abs() < 1e-6 && (a - c).abs() < 1e-6, "{a} {b} {c}");
            }
        }
    }

    /// `stack` packed as `ty`, row by row.
    fn packed(stack: &Experts, ty: GgmlType) -> Experts {
        let [count, out, input] = stack.dims();
        let values = stack.weight.to_vec::<f32>().unwrap();
        let row_bytes = ty.row_bytes(input).unwrap();
        let mut bytes = vec![0u8; count * out * row_bytes];
        for (row, dst) in values.chunks_exact(input).zip(bytes.chunks_exact_mut(row_bytes)) {
            nnx_core::quant::ggml::quantize_row(ty, row, dst).unwrap();
        }
        let weight = Tensor::from_vec(bytes, &[count, out, row_bytes]).unwrap();
        Experts { weight, bias: stack.bias.clone(), ggml: Some((ty, input)) }
    }

    #[test]
    fn a_decoded_token_over_packed_stacks_is_the_grouped_pass() {
        // One token takes the grouped product (gate and up of its experts in one pass); two
        // copies of it take the general pass, whose rows are each the same product.
        for (ty, activation) in [
            (GgmlType::Q8_0, Activation::Silu),
            (GgmlType::Q4_K, Activation::ClampedSwiglu { alpha: 1.702, limit: 7.0 }),
            (GgmlType::MXFP4, Activation::Silu),
        ] {
            let (hidden, inner) = (256, 256);
            let init = Init::Seeded(9);
            let [gate, up, down] =
                [(inner, hidden, "gate"), (inner, hidden, "up"), (hidden, inner, "down")].map(|(out, input, name)| {
                    packed(&Experts::new(4, out, input, DType::F32, init.at(name)).with_bias(DType::F32), ty)
                });
            let x: Vec<f32> = (0..hidden).map(|at| (at as f32 * 0.37).sin()).collect();
            let logits = [0.3f32, -1.0, 2.0, 0.5];
            let routing = Routing { top_k: 2, normalize: true };
            let one = Tensor::from_vec(x.clone(), &[1, hidden]).unwrap();
            let two = Tensor::from_vec([x.clone(), x].concat(), &[2, hidden]).unwrap();
            let grouped = routed(&logits, &one, [&gate, &up, &down], routing, activation).unwrap();
            let general = routed(&[logits, logits].concat(), &two, [&gate, &up, &down], routing, activation).unwrap();
            let (grouped, general) = (grouped.to_vec::<f32>().unwrap(), general.to_vec::<f32>().unwrap());
            let scale = general.iter().fold(0f32, |m, v| m.max(v.abs()));
            for (a, b) in grouped.iter().zip(&general[..hidden]) {
                assert!((a - b).abs() <= 1e-5 * scale.max(1.0), "{ty:?}: {a} {b}");
            }
        }
    }
}
