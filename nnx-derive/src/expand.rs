//! Emits the `Module` impl (the walk) of a checked input, and `Place` for a struct with a device
//! parameter. Only tokens are produced here.

use std::collections::HashSet;

use proc_macro2::{Span, TokenStream};
use quote::{quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{DeriveInput, GenericArgument, Ident, PathArguments, ReturnType, Type, TypeParamBound};

use crate::ast::{Container, Field};
use crate::ctxt::Ctxt;
use crate::{check, fallback};

/// The whole derive: parse, check, and emit either the impls or the errors beside a fallback.
pub fn derive(input: &DeriveInput) -> TokenStream {
    let cx = Ctxt::new();
    let container = Container::from_ast(&cx, input);
    check::check(&cx, &container);
    let krate = crate_path(&container);
    match cx.check() {
        Ok(()) => impls(&container, &krate),
        Err(errors) => {
            let errors = errors.to_compile_error();
            let stub = fallback::impls(input, &krate);
            quote!(#errors #stub)
        }
    }
}

/// `::nnx`, or the path given by `#[nnx(crate = "...")]`.
pub fn crate_path(container: &Container<'_>) -> TokenStream {
    match &container.attrs.crate_path {
        Some(path) => quote!(#path),
        None => quote!(::nnx),
    }
}

fn impls(container: &Container<'_>, krate: &TokenStream) -> TokenStream {
    let private = quote!(#krate::__private);
    let device = device_param(container);
    let module = module_impl(container, &private, device);
    let (place, inherent) = match device {
        Some(device) => place_impls(container, &private, device),
        None => (TokenStream::new(), TokenStream::new()),
    };
    quote! {
        #[allow(unused_qualifications, clippy::all)]
        const _: () = {
            #module
            #place
        };

        #inherent
    }
}

/// The type parameter bounded by `Device` (`struct Mlp<D: Device = Host>`), if any: such a
/// struct is a module on every device, and its host instance can be placed on the others.
fn device_param<'a>(container: &Container<'a>) -> Option<&'a Ident> {
    let is_device = |bound: &TypeParamBound| matches!(bound, TypeParamBound::Trait(bound) if bound.path.segments.last().is_some_and(|last| last.ident == "Device"));
    let in_where = |ident: &Ident| {
        container.generics.where_clause.iter().flat_map(|clause| &clause.predicates).any(|predicate| match predicate {
            syn::WherePredicate::Type(predicate) => {
                matches!(&predicate.bounded_ty, Type::Path(path) if path.path.is_ident(ident))
                    && predicate.bounds.iter().any(is_device)
            }
            _ => false,
        })
    };
    container
        .generics
        .type_params()
        .find(|param| param.bounds.iter().any(is_device) || in_where(&param.ident))
        .map(|param| &param.ident)
}

/// `ty` with the type parameter `param` replaced by `with` wherever it appears.
fn substitute(ty: &Type, param: &Ident, with: &Type) -> Type {
    let mut ty = ty.clone();
    substitute_in(&mut ty, param, with);
    ty
}

fn substitute_in(ty: &mut Type, param: &Ident, with: &Type) {
    match ty {
        Type::Path(path) if path.qself.is_none() && path.path.is_ident(param) => *ty = with.clone(),
        Type::Path(path) => {
            if let Some(qself) = &mut path.qself {
                substitute_in(&mut qself.ty, param, with);
            }
            for segment in &mut path.path.segments {
                if let PathArguments::AngleBracketed(angle) = &mut segment.arguments {
                    for argument in &mut angle.args {
                        match argument {
                            GenericArgument::Type(inner) => substitute_in(inner, param, with),
                            GenericArgument::AssocType(assoc) => substitute_in(&mut assoc.ty, param, with),
                            _ => {}
                        }
                    }
                }
            }
        }
        Type::Array(array) => substitute_in(&mut array.elem, param, with),
        Type::Slice(slice) => substitute_in(&mut slice.elem, param, with),
        Type::Group(group) => substitute_in(&mut group.elem, param, with),
        Type::Paren(paren) => substitute_in(&mut paren.elem, param, with),
        Type::Ptr(pointer) => substitute_in(&mut pointer.elem, param, with),
        Type::Reference(reference) => substitute_in(&mut reference.elem, param, with),
        Type::Tuple(tuple) => tuple.elems.iter_mut().for_each(|elem| substitute_in(elem, param, with)),
        _ => {}
    }
}

/// The one walk: `Module<D>` for a struct with a device parameter `D` (a module on every
/// device), `Module` (on the host) for any other. Beside it, one constant per field with import
/// attributes asserting that the field can hold tensors, so that the mistake is reported at
/// the field.
fn module_impl(container: &Container<'_>, private: &TokenStream, device: Option<&Ident>) -> TokenStream {
    let ident = container.ident;
    let params: HashSet<&Ident> = container.generics.type_params().map(|param| &param.ident).collect();
    let walked: Vec<&Field<'_>> = container.fields.iter().filter(|field| field.is_walked()).collect();
    let (module, on) = match device {
        Some(device) => (quote!(#private::Module<#device>), quote!(#device)),
        None => (quote!(#private::Module), quote!(#private::Host)),
    };

    let mut generics = container.generics.clone();
    let where_clause = generics.make_where_clause();
    for field in walked.iter().filter(|field| mentions(field.ty, &params)) {
        let ty = field.ty;
        where_clause.predicates.push(syn::parse_quote_spanned!(ty.span()=> #ty: #module));
    }
    let (impl_generics, ty_generics, where_clause) = generics.split_for_impl();

    // In a struct without generics (the device aside) each field type is checked on the host
    // by a constant beside the impl, at compile time; in a generic one, where a field type may
    // name a parameter, it is checked in the walk, when the impl is used.
    let host: Type = syn::parse_quote!(#private::Host);
    let generic = container
        .generics
        .params
        .iter()
        .any(|param| !matches!(param, syn::GenericParam::Type(ty) if Some(&ty.ident) == device));
    let (mut static_checks, mut generic_checks) = (Vec::new(), Vec::new());
    for field in walked.iter().filter(|field| field.attrs.has_import_rule()) {
        let ty = field.ty;
        let on_host = match device {
            Some(device) => substitute(ty, device, &host),
            None => ty.clone(),
        };
        let message = quote! {
            ::core::concat!(
                "`", ::core::stringify!(#ty), "` holds no tensors, so import attributes on this field have nothing to act on: ",
                "they apply to `Tensor`, a module with walked fields, or a `Vec`, array, `Option` or `Box` of those",
            )
        };
        if generic {
            generic_checks.push(quote_spanned!(ty.span()=>
                const { ::core::assert!(<#ty as #module>::HOLDS_TENSORS, #message) };
            ));
        } else {
            static_checks.push(quote_spanned!(ty.span()=>
                const _: () = ::core::assert!(<#on_host as #private::Module>::HOLDS_TENSORS, #message);
            ));
        }
    }

    let steps: Vec<TokenStream> = walked.iter().map(|field| step(field, private)).collect();
    let walks = walked.iter().zip(&steps).map(|(field, step)| {
        let (member, ty) = (&field.member, field.ty);
        let call = quote_spanned!(ty.span()=> <#ty as #module>::walk(&self.#member, __visitor));
        quote! { __visitor.enter(#step); #call; __visitor.leave(); }
    });
    let walks_mut = walked.iter().zip(&steps).map(|(field, step)| {
        let (member, ty) = (&field.member, field.ty);
        let call = quote_spanned!(ty.span()=> <#ty as #module>::walk_mut(&mut self.#member, __visitor));
        quote! { __visitor.enter(#step); #call; __visitor.leave(); }
    });
    let visitor = if walked.is_empty() { quote!(_) } else { quote!(__visitor) };
    let holds_tensors = !walked.is_empty();
    quote! {
        #(#static_checks)*

        #[automatically_derived]
        #[diagnostic::do_not_recommend]
        impl #impl_generics #module for #ident #ty_generics #where_clause {
            const HOLDS_TENSORS: ::core::primitive::bool = #holds_tensors;

            fn walk(&self, #visitor: &mut dyn #private::Visitor<#on>) {
                #(#generic_checks)*
                #(#walks)*
            }

            fn walk_mut(&mut self, #visitor: &mut dyn #private::VisitorMut<#on>) {
                #(#walks_mut)*
            }
        }
    }
}

/// For a struct with a device parameter `D`: `Place<To>` for the host instance `S<Host>`,
/// turning it into `S<To>` leaf by leaf and cloning skipped fields, and an inherent `place`
/// calling it. Returns the trait impl and the inherent impl.
fn place_impls(container: &Container<'_>, private: &TokenStream, device: &Ident) -> (TokenStream, TokenStream) {
    let ident = container.ident;
    let host: Type = syn::parse_quote!(#private::Host);
    let to_ident = Ident::new("__NnxTo", Span::call_site());
    let to: Type = syn::parse_quote!(#to_ident);

    // The generics without the device parameter, and the type's arguments with it replaced.
    let mut rest = container.generics.clone();
    rest.params = rest
        .params
        .into_iter()
        .filter(|param| !matches!(param, syn::GenericParam::Type(ty) if &ty.ident == device))
        .collect();
    if let Some(clause) = &mut rest.where_clause {
        clause.predicates = clause
            .predicates
            .clone()
            .into_iter()
            .filter(|predicate| {
                !matches!(predicate, syn::WherePredicate::Type(p) if matches!(&p.bounded_ty, Type::Path(path) if path.path.is_ident(device)))
            })
            .collect();
    }
    let arguments = |with: &Type| -> TokenStream {
        let items = container.generics.params.iter().map(|param| match param {
            syn::GenericParam::Type(ty) if &ty.ident == device => quote!(#with),
            syn::GenericParam::Type(ty) => {
                let ident = &ty.ident;
                quote!(#ident)
            }
            syn::GenericParam::Lifetime(lifetime) => {
                let lifetime = &lifetime.lifetime;
                quote!(#lifetime)
            }
            syn::GenericParam::Const(constant) => {
                let ident = &constant.ident;
                quote!(#ident)
            }
        });
        quote!(<#(#items),*>)
    };
    let on_host = arguments(&host);
    let on_to = arguments(&to);

    // Every walked field through `Place`, every skipped one cloned.
    let mut place_generics = rest.clone();
    place_generics.params.push(syn::parse_quote!(#to_ident: #private::Device));
    let place_where = place_generics.make_where_clause();
    for field in container.fields.iter() {
        let ty = field.ty;
        if field.is_walked() {
            let (on_host, placed) = (substitute(ty, device, &host), substitute(ty, device, &to));
            place_where
                .predicates
                .push(syn::parse_quote_spanned!(ty.span()=> #on_host: #private::Place<#to_ident, Placed = #placed>));
        } else {
            place_where.predicates.push(syn::parse_quote_spanned!(ty.span()=> #ty: ::core::clone::Clone));
        }
    }
    let (place_impl, _, place_where) = place_generics.split_for_impl();
    let members = container.fields.iter().map(|field| {
        let member = &field.member;
        if field.is_walked() {
            quote!(#member: #private::Place::place_with(&self.#member, __placer)?)
        } else {
            quote!(#member: ::core::clone::Clone::clone(&self.#member))
        }
    });
    let (rest_impl, _, rest_where) = rest.split_for_impl();
    let placer = if container.fields.iter().any(|field| field.is_walked()) { quote!(__placer) } else { quote!(_) };
    let place = quote! {
        #[automatically_derived]
        impl #place_impl #private::Place<#to_ident> for #ident #on_host #place_where {
            type Placed = #ident #on_to;

            fn place_with(&self, #placer: &mut #private::Placer<'_, #to_ident>) -> #private::Result<#ident #on_to> {
                ::core::result::Result::Ok(#ident { #(#members),* })
            }
        }
    };
    let inherent = quote! {
        #[automatically_derived]
        impl #rest_impl #ident #on_host #rest_where {
            /// This model on the device `to`, leaf by leaf (configuration fields cloned).
            /// Tensors that share storage here share one buffer there; a meta model gives a
            /// meta model on the device.
            ///
            /// # Errors
            /// The device's error when a tensor cannot be moved.
            pub fn place<#to_ident: #private::Device>(&self, to: &#to_ident) -> #private::Result<#ident #on_to>
            where
                Self: #private::Place<#to_ident, Placed = #ident #on_to>,
            {
                #private::Place::place_with(self, &mut #private::Placer::new(to))
            }
        }
    };
    (place, inherent)
}

/// `PathStep::Field(&FieldInfo { .. })` for one field, every part a constant so the reference is
/// promoted to `'static`.
fn step(field: &Field<'_>, private: &TokenStream) -> TokenStream {
    let attrs = &field.attrs;
    let name = &field.name;
    let segment = field.segment();
    let option_str = |value: Option<String>| match value {
        Some(value) => quote!(#private::Some(#value)),
        None => quote!(#private::None),
    };
    let from = option_str(attrs.from.as_ref().map(|from| from.value()));
    let tie = option_str(attrs.tie.as_ref().map(|tie| tie.value()));
    let gguf = option_str(attrs.gguf.as_ref().map(|gguf| gguf.value()));
    let rope_permute = option_str(attrs.rope_permute.as_ref().map(|rope| rope.value()));
    let offset = match &attrs.offset {
        Some(offset) => {
            let magnitude = proc_macro2::Literal::f32_suffixed(offset.value.abs());
            let sign = (offset.value < 0.0).then(|| quote!(-));
            quote!(#private::Some(#sign #magnitude))
        }
        None => quote!(#private::None),
    };
    let transpose = attrs.transpose.is_some();
    let optional = attrs.optional.is_some();
    let split = match &attrs.split {
        Some(split) => {
            let axis = split.axis.value;
            let parts = split.parts.value;
            let index = split.index.value;
            let axis = if axis < 0 {
                let magnitude = proc_macro2::Literal::isize_unsuffixed(-axis);
                quote!(-#magnitude)
            } else {
                let axis = proc_macro2::Literal::isize_unsuffixed(axis);
                quote!(#axis)
            };
            let parts = proc_macro2::Literal::usize_unsuffixed(parts);
            let index = proc_macro2::Literal::usize_unsuffixed(index);
            quote!(#private::Some(#private::Split { axis: #axis, parts: #parts, index: #index }))
        }
        None => quote!(#private::None),
    };
    let dtype = match &attrs.dtype {
        Some(dtype) => {
            let variant = Ident::new(dtype.variant, Span::call_site());
            quote!(#private::Some(#private::DType::#variant))
        }
        None => quote!(#private::None),
    };
    quote! {
        #private::PathStep::Field(&#private::FieldInfo {
            ident: #name,
            segment: #segment,
            rule: #private::ImportRule {
                from: #from,
                gguf: #gguf,
                rope_permute: #rope_permute,
                offset: #offset,
                transpose: #transpose,
                split: #split,
                tie: #tie,
                optional: #optional,
                dtype: #dtype,
            },
        })
    }
}

/// Whether a type names one of the struct's type parameters anywhere in it, so that its
/// `Module` impl depends on them and must be a bound of the generated impl.
fn mentions(ty: &Type, params: &HashSet<&Ident>) -> bool {
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
    use super::*;

    fn generic_fields(input: TokenStream) -> Vec<bool> {
        let input: DeriveInput = syn::parse2(input).unwrap();
        let params: HashSet<&Ident> = input.generics.type_params().map(|param| &param.ident).collect();
        let syn::Data::Struct(data) = &input.data else { unreachable!() };
        data.fields.iter().map(|field| mentions(&field.ty, &params)).collect()
    }

    #[test]
    fn finds_type_parameters() {
        let found = generic_fields(quote! {
            struct S<'a, M, const N: usize> {
                a: M, b: Vec<M>, c: [M; N], d: [Tensor; N], e: Tensor, f: Option<Box<M>>,
                g: &'a Tensor, h: <M as Trait>::Out, i: M::Out, j: ::M, k: (Tensor, M), l: Other<'a>,
            }
        });
        assert_eq!(found, [true, true, true, false, false, true, false, true, true, false, true, false]);
    }
}
