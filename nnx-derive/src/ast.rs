//! The derive input as plain data: the struct, its fields and their parsed attributes, its
//! device and weights parameters, and how each field converts between weight kinds.

use std::collections::HashSet;

use syn::ext::IdentExt;
use syn::{DeriveInput, GenericArgument, Generics, Ident, Member, PathArguments, ReturnType, Type, TypeParamBound};

use crate::attr;
use crate::ctxt::Ctxt;

/// A `#[derive(Module)]` input.
pub struct Container<'a> {
    /// The type's name.
    pub ident: &'a Ident,
    /// The type's generics, as written.
    pub generics: &'a Generics,
    /// The struct's own `#[nnx(...)]` attributes.
    pub attrs: attr::Container,
    /// The fields in declaration order (none for an enum or union, which is an error).
    pub fields: Vec<Field<'a>>,
}

/// One field of the struct.
pub struct Field<'a> {
    /// How the generated code reaches it: `self.name` or `self.0`.
    pub member: Member,
    /// The Rust name (without `r#`), or the index of a tuple field.
    pub name: String,
    /// The field's type.
    pub ty: &'a Type,
    /// The field's `#[nnx(...)]` attributes.
    pub attrs: attr::Field,
}

impl Field<'_> {
    /// Whether the field is walked (not `skip`).
    pub fn is_walked(&self) -> bool {
        self.attrs.skip.is_none()
    }

    /// The field's path segment: its `rename`, or its name.
    pub fn segment(&self) -> String {
        match &self.attrs.rename {
            Some(rename) => rename.value(),
            None => self.name.clone(),
        }
    }
}

/// How `map_weights` turns one field of a struct with a weights parameter `W` into the field
/// of the converted struct.
pub enum Conversion<'a> {
    /// The type does not name `W`: cloned.
    Clone,
    /// `W::Layer<D>` (or `<W as Weights>::Layer<D>`): one projection, given to `convert` with
    /// its path.
    Layer,
    /// Another type generic over `W` (a nested derived struct): converted by its own
    /// `MapWeights`.
    Module,
    /// A type with one type argument that names `W` (`Option`, `Vec`, `Box`): each item
    /// converted as the argument says, through `MapEach`.
    Each(&'a Type, Box<Conversion<'a>>),
    /// Any other type naming `W` (a tuple, an array, a reference): not convertible.
    Unsupported,
}

/// How a field of type `ty` converts, in a struct whose weights parameter is `weights`.
/// Containers are recognised by shape (one type argument), not by name, and what they are
/// able to do is left to the `MapEach` trait, so that a container it does not implement is a
/// trait-bound error at the field. A type whose only argument is `W` itself (`Block<W>`) is a
/// module, not a container.
pub fn conversion<'a>(ty: &'a Type, weights: &Ident) -> Conversion<'a> {
    if !mentions(ty, &HashSet::from([weights])) {
        return Conversion::Clone;
    }
    let Type::Path(path) = ty else { return Conversion::Unsupported };
    let segments = &path.path.segments;
    let last = segments.last();
    let is_layer = match &path.qself {
        Some(qself) => matches!(&*qself.ty, Type::Path(inner) if inner.qself.is_none() && inner.path.is_ident(weights)),
        None => path.path.leading_colon.is_none() && segments.len() == 2 && segments[0].ident == *weights,
    } && last.is_some_and(|last| last.ident == "Layer");
    if is_layer {
        return Conversion::Layer;
    }
    if path.qself.is_some() {
        return Conversion::Unsupported;
    }
    let arguments: Vec<&Type> = match last.map(|last| &last.arguments) {
        Some(PathArguments::AngleBracketed(angle)) => angle
            .args
            .iter()
            .filter_map(|argument| match argument {
                GenericArgument::Type(ty) => Some(ty),
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    };
    match arguments.as_slice() {
        [inner] if !matches!(inner, Type::Path(bare) if bare.qself.is_none() && bare.path.is_ident(weights)) => {
            Conversion::Each(inner, Box::new(conversion(inner, weights)))
        }
        _ => Conversion::Module,
    }
}

/// The type parameter bounded (inline or in the `where` clause) by a trait whose last path
/// segment is `name`, if any.
fn bounded_param<'a>(generics: &'a Generics, name: &str) -> Option<&'a Ident> {
    let is_bound = |bound: &TypeParamBound| matches!(bound, TypeParamBound::Trait(bound) if bound.path.segments.last().is_some_and(|last| last.ident == name));
    let in_where = |ident: &Ident| {
        generics.where_clause.iter().flat_map(|clause| &clause.predicates).any(|predicate| match predicate {
            syn::WherePredicate::Type(predicate) => {
                matches!(&predicate.bounded_ty, Type::Path(path) if path.path.is_ident(ident))
                    && predicate.bounds.iter().any(is_bound)
            }
            _ => false,
        })
    };
    generics
        .type_params()
        .find(|param| param.bounds.iter().any(is_bound) || in_where(&param.ident))
        .map(|param| &param.ident)
}

/// The type parameter bounded by `Device` (`struct Mlp<D: Device = Host>`), if any: such a
/// struct is a module on every device, and its host instance can be placed on the others.
pub fn device_param(generics: &Generics) -> Option<&Ident> {
    bounded_param(generics, "Device")
}

/// The type parameter bounded by `Weights` (`struct Mlp<D: Device = Host, W: Weights = Dense>`),
/// if any: such a struct gets `map_weights`, converting its host instance to another weight
/// kind. The bound is the declaration: a struct must write it to name `W::Layer<D>` at all, so
/// recognising it asks nothing more of the user (no attribute repeating it), exactly as the
/// device parameter is recognised by its `Device` bound.
pub fn weights_param(generics: &Generics) -> Option<&Ident> {
    bounded_param(generics, "Weights")
}

impl<'a> Container<'a> {
    /// Reads the derive input, recording unsupported shapes and attribute mistakes in `cx`.
    pub fn from_ast(cx: &Ctxt, input: &'a DeriveInput) -> Container<'a> {
        let attrs = attr::Container::from_ast(cx, &input.attrs);
        let fields = match &input.data {
            syn::Data::Struct(data) => data
                .fields
                .iter()
                .enumerate()
                .map(|(index, field)| {
                    let (member, name) = match &field.ident {
                        Some(ident) => (Member::Named(ident.clone()), ident.unraw().to_string()),
                        None => (Member::Unnamed(index.into()), index.to_string()),
                    };
                    Field { member, name, ty: &field.ty, attrs: attr::Field::from_ast(cx, &field.attrs) }
                })
                .collect(),
            syn::Data::Enum(data) => {
                cx.error_spanned_by(
                    data.enum_token,
                    "`#[derive(Module)]` does not support enums: a module's tensors need fixed names; \
                     use a struct, with an `Option` field for each alternative",
                );
                Vec::new()
            }
            syn::Data::Union(data) => {
                cx.error_spanned_by(
                    data.union_token,
                    "`#[derive(Module)]` does not support unions: the walk cannot know which field holds \
                     a value; use a struct",
                );
                Vec::new()
            }
        };
        Container { ident: &input.ident, generics: &input.generics, attrs, fields }
    }
}

/// Whether a type names one of the struct's type parameters anywhere in it, so that its
/// `Module` impl depends on them and must be a bound of the generated impl.
pub fn mentions(ty: &Type, params: &HashSet<&Ident>) -> bool {
    if params.is_empty() {
        return false;
    }
    match ty {
        Type::Array(array) => mentions(&array.elem, params),
        Type::Slice(slice) => mentions(&slice.elem, params),
        Type::Group(group) => mentions(&group.elem, params),
        Type::Paren(paren) => mentions(&paren.elem, params),
        Type::Ptr(pointer) => mentions(&pointer.elem, params),
        Type::Reference(reference) => mentions(&reference.elem, params),
        Type::Tuple(tuple) => tuple.elems.iter().any(|elem| mentions(elem, params)),
        Type::Path(path) => {
            path.qself.as_ref().is_some_and(|qself| mentions(&qself.ty, params))
                || path.path.leading_colon.is_none()
                    && path.path.segments.first().is_some_and(|first| params.contains(&first.ident))
                || path.path.segments.iter().any(|segment| arguments_mention(&segment.arguments, params))
        }
        Type::FnPtr(function) => {
            function.inputs.iter().any(|input| mentions(&input.ty, params))
                || matches!(&function.output, ReturnType::Type(_, output) if mentions(output, params))
        }
        Type::TraitObject(object) => bounds_mention(object.bounds.iter(), params),
        Type::ImplTrait(object) => bounds_mention(object.bounds.iter(), params),
        // A macro could expand to anything: bound it, which is always sound.
        Type::Macro(_) => true,
        _ => false,
    }
}

fn arguments_mention(arguments: &PathArguments, params: &HashSet<&Ident>) -> bool {
    match arguments {
        PathArguments::None => false,
        PathArguments::AngleBracketed(angle) => angle.args.iter().any(|argument| match argument {
            GenericArgument::Type(ty) => mentions(ty, params),
            GenericArgument::AssocType(assoc) => mentions(&assoc.ty, params),
            _ => false,
        }),
        PathArguments::Parenthesized(parenthesized) => {
            parenthesized.inputs.iter().any(|input| mentions(&input.ty, params))
                || matches!(&parenthesized.output, ReturnType::Type(_, output) if mentions(output, params))
        }
    }
}

fn bounds_mention<'a>(mut bounds: impl Iterator<Item = &'a TypeParamBound>, params: &HashSet<&Ident>) -> bool {
    bounds.any(|bound| match bound {
        TypeParamBound::Trait(bound) => {
            bound.path.segments.iter().any(|segment| arguments_mention(&segment.arguments, params))
        }
        _ => false,
    })
}

#[cfg(test)]
mod tests {
    use proc_macro2::TokenStream;
    use quote::quote;

    use super::*;

    fn fields(input: TokenStream) -> (DeriveInput, Vec<Type>) {
        let input: DeriveInput = syn::parse2(input).unwrap();
        let syn::Data::Struct(data) = &input.data else { unreachable!() };
        let types = data.fields.iter().map(|field| field.ty.clone()).collect();
        (input, types)
    }

    #[test]
    fn finds_type_parameters() {
        let (input, types) = fields(quote! {
            struct S<'a, M, const N: usize> {
                a: M, b: Vec<M>, c: [M; N], d: [Tensor; N], e: Tensor, f: Option<Box<M>>,
                g: &'a Tensor, h: <M as Trait>::Out, i: M::Out, j: ::M, k: (Tensor, M), l: Other<'a>,
            }
        });
        let params: HashSet<&Ident> = input.generics.type_params().map(|param| &param.ident).collect();
        let found: Vec<bool> = types.iter().map(|ty| mentions(ty, &params)).collect();
        assert_eq!(found, [true, true, true, false, false, true, false, true, true, false, true, false]);
    }

    fn describe(conversion: &Conversion<'_>) -> String {
        match conversion {
            Conversion::Clone => "clone".into(),
            Conversion::Layer => "layer".into(),
            Conversion::Module => "module".into(),
            Conversion::Each(_, inner) => format!("each({})", describe(inner)),
            Conversion::Unsupported => "unsupported".into(),
        }
    }

    #[test]
    fn classifies_fields_by_the_weights_parameter() {
        let (input, types) = fields(quote! {
            struct S<D: Device, W: Weights> where W: Clone {
                a: W::Layer<D>, b: Option<W::Layer<D>>, c: Vec<Block<D, W>>, d: Block<W>, e: RmsNorm<D>,
                f: <W as Weights>::Layer<D>, g: Option<Vec<W::Layer<D>>>, h: (W::Layer<D>, Tensor<D>),
                i: [W::Layer<D>; 2], j: W, k: Vec<Tensor<D>>,
            }
        });
        let weights = weights_param(&input.generics).unwrap();
        assert_eq!(device_param(&input.generics).unwrap(), "D");
        let found: Vec<String> = types.iter().map(|ty| describe(&conversion(ty, weights))).collect();
        assert_eq!(
            found,
            [
                "layer",
                "each(layer)",
                "each(module)",
                "module",
                "clone",
                "layer",
                "each(each(layer))",
                "unsupported",
                "unsupported",
                "module",
                "clone",
            ]
        );
    }
}
