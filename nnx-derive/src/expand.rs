//! Emits the `Module` and `HoldsTensors` impls of a checked input. Only tokens are produced here.

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
    let ident = container.ident;
    let params: HashSet<&Ident> = container.generics.type_params().map(|param| &param.ident).collect();
    let walked: Vec<&Field<'_>> = container.fields.iter().filter(|field| field.is_walked()).collect();

    let mut generics = container.generics.clone();
    let where_clause = generics.make_where_clause();
    for field in walked.iter().filter(|field| mentions(field.ty, &params)) {
        let ty = field.ty;
        where_clause.predicates.push(syn::parse_quote_spanned!(ty.span()=> #ty: #private::Module));
        if field.attrs.has_import_rule() {
            where_clause.predicates.push(syn::parse_quote_spanned!(ty.span()=> #ty: #private::HoldsTensors));
        }
    }
    let (impl_generics, ty_generics, where_clause) = generics.split_for_impl();

    let assertions = walked.iter().filter(|field| field.attrs.has_import_rule()).map(|field| {
        let ty = field.ty;
        quote_spanned!(ty.span()=> let _ = #private::assert_holds_tensors::<#ty>;)
    });
    let steps: Vec<TokenStream> = walked.iter().map(|field| step(field, &private)).collect();
    let walks = walked.iter().zip(&steps).map(|(field, step)| {
        let (member, ty) = (&field.member, field.ty);
        let call = quote_spanned!(field.ty.span()=> <#ty as #private::Module>::walk(&self.#member, __visitor));
        quote! {
            __visitor.enter(#step);
            #call;
            __visitor.leave();
        }
    });
    let walks_mut = walked.iter().zip(&steps).map(|(field, step)| {
        let (member, ty) = (&field.member, field.ty);
        let call = quote_spanned!(field.ty.span()=> <#ty as #private::Module>::walk_mut(&mut self.#member, __visitor));
        quote! {
            __visitor.enter(#step);
            #call;
            __visitor.leave();
        }
    });
    let visitor = if walked.is_empty() { quote!(_) } else { quote!(__visitor) };
    let holds_tensors = (!walked.is_empty()).then(|| {
        quote! {
            #[automatically_derived]
            #[diagnostic::do_not_recommend]
            impl #impl_generics #private::HoldsTensors for #ident #ty_generics #where_clause {}
        }
    });
    quote! {
        #[allow(unused_qualifications, clippy::all)]
        const _: () = {
            #[automatically_derived]
            #[diagnostic::do_not_recommend]
            impl #impl_generics #private::Module for #ident #ty_generics #where_clause {
                fn walk(&self, #visitor: &mut dyn #private::Visitor) {
                    #(#assertions)*
                    #(#walks)*
                }

                fn walk_mut(&mut self, #visitor: &mut dyn #private::VisitorMut) {
                    #(#walks_mut)*
                }
            }

            #holds_tensors
        };
    }
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
