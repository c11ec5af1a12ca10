//! The `Module` trait: one walk over a model's tensors, shared and mutable, carrying each
//! field's path segment and recorded import rule. Every capability (state dicts, loads,
//! archives, imports) is a visitor over this walk.

use crate::state::{self, FlatStateDict, LoadOptions, LoadReport, StateDict};
use crate::{DType, Device, Host, Result, Tensor};

/// How a field's tensors are found in a file laid out by someone else, as recorded from its
/// `#[nnx(...)]` attributes. The derive fills it in; importers read it from the walk.
///
/// Two namings are recorded: the transformers one (`from`, `transpose`, `split`, `offset`) and
/// llama.cpp's GGUF one (`gguf`, `rope_permute`); [`Naming`] picks which a walk follows.
/// `tie`, `optional` and `dtype` hold in both.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct ImportRule {
    /// `from = "a.b"`: the source name relative to the parent's source path.
    pub from: Option<&'static str>,
    /// `gguf = "attn_q"`: the source name in a GGUF file; `""` adds no segment.
    pub gguf: Option<&'static str>,
    /// `rope_permute = "head_count"`: the GGUF file stores the rows in llama.cpp's rotary
    /// order, grouped by the heads that `{arch}.attention.<key>` counts.
    pub rope_permute: Option<&'static str>,
    /// `offset = 1.0`: a transformers-named source stores the value minus this.
    pub offset: Option<f32>,
    /// `transpose`: the source stores the transpose (last two axes) of every rank-2+ tensor.
    pub transpose: bool,
    /// `split(axis, parts, index)`: the field is one equal piece of the source.
    pub split: Option<Split>,
    /// `tie = "x.y"`: the field is the same tensor as the field at this model path.
    pub tie: Option<&'static str>,
    /// `optional`: the source may lack the field; it then keeps its value.
    pub optional: bool,
    /// `dtype = "u32"`: the dtype every tensor under the field must have.
    pub dtype: Option<DType>,
}

// Offsets are finite (the derive refuses any other), so equality is reflexive.
impl Eq for ImportRule {}

impl ImportRule {
    /// The rule of a field without import attributes.
    pub const NONE: ImportRule = ImportRule {
        from: None,
        gguf: None,
        rope_permute: None,
        offset: None,
        transpose: false,
        split: None,
        tie: None,
        optional: false,
        dtype: None,
    };

    /// Whether the rule changes anything about how the field is read.
    pub fn is_plain(&self) -> bool {
        *self == ImportRule::NONE
    }
}

/// Piece `index` of `parts` equal pieces along `axis` (negative counts from the end).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Split {
    /// The axis cut; `-1` is the last.
    pub axis: isize,
    /// How many equal pieces the source holds.
    pub parts: usize,
    /// Which piece this field is.
    pub index: usize,
}

/// A field of a module as the derive records it (its name, path segment and import rule):
/// static data, visible to every visitor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FieldInfo {
    /// The Rust field name (or index, for tuple structs).
    pub ident: &'static str,
    /// The path segment: the field name, or its `rename`.
    pub segment: &'static str,
    /// The recorded import rule.
    pub rule: ImportRule,
}

/// One step down the module tree, as the walk reports it to a [`Visitor`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathStep {
    /// Into a named (or tuple) field.
    Field(&'static FieldInfo),
    /// Into element `i` of a `Vec` or array.
    Index(usize),
}

/// Receives a shared walk: `enter` and `leave` bracket each step, `tensor` each tensor (on the
/// device `D`, the host unless said otherwise).
pub trait Visitor<D: Device = Host> {
    /// Going one step down.
    fn enter(&mut self, step: PathStep);
    /// A tensor at the current path.
    fn tensor(&mut self, tensor: &Tensor<D>);
    /// Coming back up from the last `enter`.
    fn leave(&mut self);
}

/// Receives a mutable walk; see [`Visitor`].
pub trait VisitorMut<D: Device = Host> {
    /// Going one step down.
    fn enter(&mut self, step: PathStep);
    /// A tensor at the current path, which the visitor may replace.
    fn tensor(&mut self, tensor: &mut Tensor<D>);
    /// Coming back up from the last `enter`.
    fn leave(&mut self);
}

/// A value made of named tensors on the device `D` (the host unless said otherwise): a model, a
/// layer, an optimizer state, or a single tensor.
///
/// Derive it with `#[derive(Module)]`; the derive writes the walk and nothing else. Everything a
/// module can do is a visitor over that walk: the state-dict methods below (on host modules),
/// imports, archives and placement. A struct with a device parameter
/// (`struct Mlp<D: Device = Host>`) is a module on every device; one without is a host module.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a Module, so `#[derive(Module)]` cannot walk this field",
    label = "not a Module: add `#[nnx(skip)]` if this field is configuration, or derive `Module` for its type",
    note = "fields are walked when they are `Tensor`, a `#[derive(Module)]` type, an nnx layer, or a `Vec`, array, `Option` or `Box` of those"
)]
pub trait Module<D: Device = Host> {
    /// Whether a value of this type can hold a tensor: false for a module whose fields are all
    /// skipped, which import attributes then have nothing to act on.
    const HOLDS_TENSORS: bool = true;

    /// Visits every tensor in declaration order.
    fn walk(&self, visitor: &mut dyn Visitor<D>);

    /// Visits every tensor mutably in declaration order.
    fn walk_mut(&mut self, visitor: &mut dyn VisitorMut<D>);

    /// Every tensor keyed by its path, in walk order. Tensors are shared, not copied.
    fn flat_state_dict(&self) -> FlatStateDict
    where
        Self: Module<Host>,
    {
        state::flat_state_dict(self)
    }

    /// The tensors as a tree of dictionaries keyed by path segment, in walk order.
    fn state_dict(&self) -> StateDict
    where
        Self: Module<Host>,
    {
        StateDict::from_flat(&<Self as Module>::flat_state_dict(self))
    }

    /// Partial load: every key the module and `dict` share is replaced by the dict's tensor
    /// (shared, not copied); the rest keep their values.
    ///
    /// # Errors
    /// A [`crate::LoadError`] (nothing changed) when a shared key's dtype or shape differs, or
    /// when no key matches at all (use [`Module::load_flat_state_dict_with`] to allow that).
    fn load_flat_state_dict(&mut self, dict: &FlatStateDict) -> Result<LoadReport>
    where
        Self: Module<Host>,
    {
        state::load_flat(self, dict, &LoadOptions::default())
    }

    /// [`Module::load_flat_state_dict`] with options.
    ///
    /// # Errors
    /// As [`Module::load_flat_state_dict`].
    fn load_flat_state_dict_with(&mut self, dict: &FlatStateDict, options: &LoadOptions) -> Result<LoadReport>
    where
        Self: Module<Host>,
    {
        state::load_flat(self, dict, options)
    }

    /// All-or-nothing load: every key, dtype and shape is checked first; on any problem the
    /// module is left unchanged and the error lists every problem with its full key.
    ///
    /// # Errors
    /// A [`crate::LoadError`] listing missing and unexpected keys (with did-you-mean
    /// suggestions) and dtype and shape mismatches.
    fn load_flat_state_dict_strict(&mut self, dict: &FlatStateDict) -> Result<()>
    where
        Self: Module<Host>,
    {
        state::load_flat_strict(self, dict)
    }

    /// [`Module::load_flat_state_dict`] from a nested dict.
    ///
    /// # Errors
    /// As [`Module::load_flat_state_dict`].
    fn load_state_dict(&mut self, dict: &StateDict) -> Result<LoadReport>
    where
        Self: Module<Host>,
    {
        <Self as Module>::load_flat_state_dict(self, &dict.to_flat())
    }

    /// [`Module::load_flat_state_dict_strict`] from a nested dict.
    ///
    /// # Errors
    /// As [`Module::load_flat_state_dict_strict`].
    fn load_state_dict_strict(&mut self, dict: &StateDict) -> Result<()>
    where
        Self: Module<Host>,
    {
        <Self as Module>::load_flat_state_dict_strict(self, &dict.to_flat())
    }

    /// The module's type name without its module path, for messages.
    fn module_name(&self) -> &'static str {
        short_type_name(std::any::type_name::<Self>())
    }
}

/// `a::b::Gpt2<c::Block>` -> `Gpt2<c::Block>`: drop the path before the first `<`.
pub fn short_type_name(full: &'static str) -> &'static str {
    let head = full.find('<').unwrap_or(full.len());
    match full[..head].rfind("::") {
        Some(at) => &full[at + 2..],
        None => full,
    }
}

// Every impl of `Module` is marked `do_not_recommend`: a missing impl is then reported for the
// type the user wrote (`usize`, not `Vec<usize>`), and compile errors do not list whichever
// types happen to implement the trait.

#[diagnostic::do_not_recommend]
impl<D: Device> Module<D> for Tensor<D> {
    fn walk(&self, visitor: &mut dyn Visitor<D>) {
        visitor.tensor(self);
    }

    fn walk_mut(&mut self, visitor: &mut dyn VisitorMut<D>) {
        visitor.tensor(self);
    }
}

/// Walks a sequence, each element under its index.
fn walk_items<D: Device, M: Module<D>>(items: &[M], visitor: &mut dyn Visitor<D>) {
    for (index, item) in items.iter().enumerate() {
        visitor.enter(PathStep::Index(index));
        item.walk(visitor);
        visitor.leave();
    }
}

/// Walks a sequence mutably, each element under its index.
fn walk_items_mut<D: Device, M: Module<D>>(items: &mut [M], visitor: &mut dyn VisitorMut<D>) {
    for (index, item) in items.iter_mut().enumerate() {
        visitor.enter(PathStep::Index(index));
        item.walk_mut(visitor);
        visitor.leave();
    }
}

#[diagnostic::do_not_recommend]
impl<D: Device, M: Module<D>> Module<D> for Vec<M> {
    const HOLDS_TENSORS: bool = M::HOLDS_TENSORS;

    fn walk(&self, visitor: &mut dyn Visitor<D>) {
        walk_items(self, visitor);
    }

    fn walk_mut(&mut self, visitor: &mut dyn VisitorMut<D>) {
        walk_items_mut(self, visitor);
    }
}

#[diagnostic::do_not_recommend]
impl<D: Device, M: Module<D>, const N: usize> Module<D> for [M; N] {
    const HOLDS_TENSORS: bool = M::HOLDS_TENSORS;

    fn walk(&self, visitor: &mut dyn Visitor<D>) {
        walk_items(self, visitor);
    }

    fn walk_mut(&mut self, visitor: &mut dyn VisitorMut<D>) {
        walk_items_mut(self, visitor);
    }
}

#[diagnostic::do_not_recommend]
impl<D: Device, M: Module<D>> Module<D> for Option<M> {
    const HOLDS_TENSORS: bool = M::HOLDS_TENSORS;

    fn walk(&self, visitor: &mut dyn Visitor<D>) {
        if let Some(inner) = self {
            inner.walk(visitor);
        }
    }

    fn walk_mut(&mut self, visitor: &mut dyn VisitorMut<D>) {
        if let Some(inner) = self {
            inner.walk_mut(visitor);
        }
    }
}

#[diagnostic::do_not_recommend]
impl<D: Device, M: Module<D> + ?Sized> Module<D> for Box<M> {
    const HOLDS_TENSORS: bool = M::HOLDS_TENSORS;

    fn walk(&self, visitor: &mut dyn Visitor<D>) {
        (**self).walk(visitor);
    }

    fn walk_mut(&mut self, visitor: &mut dyn VisitorMut<D>) {
        (**self).walk_mut(visitor);
    }
}

/// One import operation on the way from a source entry to a model tensor.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ImportOp {
    /// Keep piece `index` of `parts` along `axis`.
    Split(Split),
    /// Swap the last two axes (rank-2+ tensors only).
    Transpose,
    /// Undo llama.cpp's rotary row order: the rows form groups (one per head, counted by the
    /// GGUF key `{arch}.attention.<key>`) of `[half, 2]` pairs that the model reads as `[2, half]`.
    RopePermute(&'static str),
    /// Add this to every value (after any cast to the model's dtype).
    Offset(f32),
}

// Offsets are finite (the derive refuses any other), so equality is reflexive.
impl Eq for ImportOp {}

/// Which of a field's recorded source names a walk follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Naming {
    /// `from`, `transpose`, `split` and `offset`: checkpoints as transformers writes them.
    #[default]
    Transformers,
    /// `gguf` and `rope_permute`: GGUF files as llama.cpp's converter writes them.
    Gguf,
}

/// What the walk knows about one tensor's place in the model: its model path, its source path
/// and everything its import rules say.
#[derive(Debug, Clone, Copy)]
pub struct TensorSlot<'a> {
    /// The model path, e.g. `h.0.attn.q.weight`.
    pub name: &'a str,
    /// The source path for import, e.g. `h.0.attn.c_attn.weight`.
    pub source: &'a str,
    /// Import operations from the source entry to this tensor, outermost field first
    /// (within a field: split, then transpose).
    pub ops: &'a [ImportOp],
    /// Whether some enclosing field is `optional`.
    pub optional: bool,
    /// The dtype required by the innermost enclosing `dtype` attribute.
    pub dtype: Option<DType>,
    /// For tensors under a `tie` field: the model path of the tensor they are tied to.
    pub tie: Option<&'a str>,
}

#[derive(Clone)]
struct Frame {
    name_len: usize,
    source_len: usize,
    tie_len: Option<usize>,
    ops_len: usize,
    optional: bool,
    dtype: Option<DType>,
    tied: bool,
}

/// Tracks model path, source path and import rules through `enter`/`leave`, so visitors deal
/// in [`TensorSlot`] values instead of steps.
#[derive(Default)]
struct PathTracker {
    naming: Naming,
    name: String,
    source: String,
    tie: String,
    tied: bool,
    ops: Vec<ImportOp>,
    optional: bool,
    dtype: Option<DType>,
    frames: Vec<Frame>,
}

fn push_segment(path: &mut String, segment: &str) {
    if !path.is_empty() {
        path.push('.');
    }
    path.push_str(segment);
}

impl PathTracker {
    fn enter(&mut self, step: PathStep) {
        self.frames.push(Frame {
            name_len: self.name.len(),
            source_len: self.source.len(),
            tie_len: self.tied.then_some(self.tie.len()),
            ops_len: self.ops.len(),
            optional: self.optional,
            dtype: self.dtype,
            tied: self.tied,
        });
        match step {
            PathStep::Index(index) => {
                let index = index.to_string();
                push_segment(&mut self.name, &index);
                push_segment(&mut self.source, &index);
                if self.tied {
                    push_segment(&mut self.tie, &index);
                }
            }
            PathStep::Field(field) => {
                let rule = &field.rule;
                push_segment(&mut self.name, field.segment);
                match self.naming {
                    Naming::Transformers => push_segment(&mut self.source, rule.from.unwrap_or(field.segment)),
                    Naming::Gguf => match rule.gguf {
                        Some("") => {}
                        gguf => push_segment(&mut self.source, gguf.unwrap_or(field.segment)),
                    },
                }
                if self.tied {
                    push_segment(&mut self.tie, field.segment);
                }
                if let Some(target) = rule.tie {
                    self.tied = true;
                    self.tie.clear();
                    self.tie.push_str(target);
                }
                match self.naming {
                    Naming::Transformers => {
                        if let Some(split) = rule.split {
                            self.ops.push(ImportOp::Split(split));
                        }
                        if rule.transpose {
                            self.ops.push(ImportOp::Transpose);
                        }
                        if let Some(offset) = rule.offset {
                            self.ops.push(ImportOp::Offset(offset));
                        }
                    }
                    Naming::Gguf => {
                        if let Some(key) = rule.rope_permute {
                            self.ops.push(ImportOp::RopePermute(key));
                        }
                    }
                }
                self.optional |= rule.optional;
                if rule.dtype.is_some() {
                    self.dtype = rule.dtype;
                }
            }
        }
    }

    fn leave(&mut self) {
        let frame = self.frames.pop().expect("`leave` follows `enter`");
        self.name.truncate(frame.name_len);
        self.source.truncate(frame.source_len);
        self.ops.truncate(frame.ops_len);
        self.optional = frame.optional;
        self.dtype = frame.dtype;
        self.tied = frame.tied;
        if let Some(len) = frame.tie_len {
            self.tie.truncate(len);
        }
    }

    fn slot(&self) -> TensorSlot<'_> {
        TensorSlot {
            name: &self.name,
            source: &self.source,
            ops: &self.ops,
            optional: self.optional,
            dtype: self.dtype,
            tie: self.tied.then_some(self.tie.as_str()),
        }
    }
}

struct SlotVisitor<F> {
    tracker: PathTracker,
    f: F,
}

impl<D: Device, F: FnMut(TensorSlot<'_>, &Tensor<D>)> Visitor<D> for SlotVisitor<F> {
    fn enter(&mut self, step: PathStep) {
        self.tracker.enter(step);
    }

    fn tensor(&mut self, tensor: &Tensor<D>) {
        (self.f)(self.tracker.slot(), tensor);
    }

    fn leave(&mut self) {
        self.tracker.leave();
    }
}

impl<D: Device, F: FnMut(TensorSlot<'_>, &mut Tensor<D>)> VisitorMut<D> for SlotVisitor<F> {
    fn enter(&mut self, step: PathStep) {
        self.tracker.enter(step);
    }

    fn tensor(&mut self, tensor: &mut Tensor<D>) {
        (self.f)(self.tracker.slot(), tensor);
    }

    fn leave(&mut self) {
        self.tracker.leave();
    }
}

/// Calls `f` with the [`TensorSlot`] and tensor of every tensor of `module`, in walk order.
///
/// # Examples
/// ```
/// use nnx_core::{for_each_entry, nn::Linear};
/// let layer = Linear::builder(4, 2).build();
/// let mut names = Vec::new();
/// for_each_entry(&layer, |entry, _| names.push(entry.name.to_string()));
/// assert_eq!(names, ["weight", "bias"]);
/// ```
pub fn for_each_entry<D: Device, M: Module<D> + ?Sized>(module: &M, f: impl FnMut(TensorSlot<'_>, &Tensor<D>)) {
    for_each_entry_named(module, Naming::Transformers, f);
}

/// [`for_each_entry`] with the source names and operations of `naming`.
pub fn for_each_entry_named<D: Device, M: Module<D> + ?Sized>(
    module: &M,
    naming: Naming,
    f: impl FnMut(TensorSlot<'_>, &Tensor<D>),
) {
    module.walk(&mut SlotVisitor { tracker: PathTracker { naming, ..PathTracker::default() }, f });
}

/// Calls `f` with the [`TensorSlot`] and a mutable tensor of every tensor of `module`, in walk order.
pub fn for_each_entry_mut<D: Device, M: Module<D> + ?Sized>(
    module: &mut M,
    f: impl FnMut(TensorSlot<'_>, &mut Tensor<D>),
) {
    module.walk_mut(&mut SlotVisitor { tracker: PathTracker::default(), f });
}

/// Moves a model from the host to a device leaf by leaf: what `model.place(&gpu)` does.
///
/// The derive implements it for structs with a device parameter (`struct Mlp<D: Device = Host>`),
/// turning `Mlp<Host>` into `Mlp<To>`; configuration fields (`#[nnx(skip)]`) are cloned.
/// Tensors that share one storage on the host (tied weights) share one buffer on the device.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be placed on a device",
    label = "placing needs a host model whose tensors are `Tensor<D>` for its device parameter `D`",
    note = "declare the device as a parameter (`struct M<D: Device = Host> {{ w: Tensor<D> }}`) and derive `Module`"
)]
pub trait Place<To: Device> {
    /// The same value on `To`.
    type Placed;

    /// Places every tensor through `placer`, which keeps shared storages shared.
    ///
    /// # Errors
    /// The device's error when a tensor cannot be moved.
    fn place_with(&self, placer: &mut Placer<'_, To>) -> Result<Self::Placed>;
}

/// The device a [`Place`] goes to, and the tensors already placed, by storage and layout.
pub struct Placer<'a, To: Device> {
    to: &'a To,
    placed: Vec<(Tensor, Tensor<To>)>,
}

impl<'a, To: Device> Placer<'a, To> {
    /// A placer onto `to`.
    pub fn new(to: &'a To) -> Placer<'a, To> {
        Placer { to, placed: Vec::new() }
    }

    /// `tensor` on the device: the tensor placed before when it is the same view of the same
    /// storage, otherwise a new upload.
    ///
    /// # Errors
    /// The device's error when the tensor cannot be moved.
    pub fn tensor(&mut self, tensor: &Tensor) -> Result<Tensor<To>> {
        let same = |seen: &Tensor| {
            seen.shares_storage(tensor)
                && seen.offset() == tensor.offset()
                && seen.shape() == tensor.shape()
                && seen.strides() == tensor.strides()
                && seen.dtype() == tensor.dtype()
        };
        if let Some((_, placed)) = self.placed.iter().find(|(seen, _)| same(seen)) {
            return Ok(placed.clone());
        }
        let placed = self.to.upload(tensor)?;
        if !tensor.is_meta() {
            self.placed.push((tensor.clone(), placed.clone()));
        }
        Ok(placed)
    }
}

impl<To: Device> Place<To> for Tensor {
    type Placed = Tensor<To>;

    fn place_with(&self, placer: &mut Placer<'_, To>) -> Result<Tensor<To>> {
        placer.tensor(self)
    }
}

impl<To: Device, M: Place<To>> Place<To> for Vec<M> {
    type Placed = Vec<M::Placed>;

    fn place_with(&self, placer: &mut Placer<'_, To>) -> Result<Vec<M::Placed>> {
        self.iter().map(|item| item.place_with(placer)).collect()
    }
}

impl<To: Device, M: Place<To>, const N: usize> Place<To> for [M; N] {
    type Placed = [M::Placed; N];

    fn place_with(&self, placer: &mut Placer<'_, To>) -> Result<[M::Placed; N]> {
        let placed: Vec<M::Placed> = self.iter().map(|item| item.place_with(placer)).collect::<Result<_>>()?;
        Ok(placed.try_into().unwrap_or_else(|_| unreachable!("one placed item per item")))
    }
}

impl<To: Device, M: Place<To>> Place<To> for Option<M> {
    type Placed = Option<M::Placed>;

    fn place_with(&self, placer: &mut Placer<'_, To>) -> Result<Option<M::Placed>> {
        self.as_ref().map(|item| item.place_with(placer)).transpose()
    }
}

impl<To: Device, M: Place<To>> Place<To> for Box<M> {
    type Placed = Box<M::Placed>;

    fn place_with(&self, placer: &mut Placer<'_, To>) -> Result<Box<M::Placed>> {
        (**self).place_with(placer).map(Box::new)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nn::Linear;

    /// Every container of layers, on any device.
    #[derive(Clone, Debug, nnx_derive::Module)]
    #[nnx(crate = "crate")]
    struct Stack<D: Device = Host> {
        layers: [Linear<D>; 2],
        rest: Vec<Linear<D>>,
        head: Option<Box<Linear<D>>>,
        #[nnx(skip)]
        name: String,
    }

    fn names<D: Device>(module: &impl Module<D>) -> Vec<String> {
        let mut names = Vec::new();
        for_each_entry(module, |slot, _| names.push(slot.name.to_string()));
        names
    }

    #[test]
    fn containers_walk_load_and_place_alike() {
        let layer = |bias| Linear::builder(2, 2).bias(bias).build();
        let mut stack = Stack {
            layers: [layer(true), layer(false)],
            rest: vec![layer(false)],
            head: Some(Box::new(layer(true))),
            name: "stack".to_string(),
        };
        let expected =
            ["layers.0.weight", "layers.0.bias", "layers.1.weight", "rest.0.weight", "head.weight", "head.bias"];
        assert_eq!(names(&stack), expected);
        let dict = stack.flat_state_dict();
        stack.load_flat_state_dict_strict(&dict).unwrap();

        let placed: Stack = stack.place(&Host).unwrap();
        assert_eq!(names(&placed), expected);
        assert_eq!(placed.name, "stack");
    }

    #[test]
    fn short_names_drop_the_path() {
        assert_eq!(short_type_name("a::b::Mlp"), "Mlp");
        assert_eq!(short_type_name("a::Adam<x::Mlp>"), "Adam<x::Mlp>");
        assert_eq!(short_type_name("Mlp"), "Mlp");
    }
}
