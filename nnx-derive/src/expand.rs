//! Emits the `Module` impl (the walk) of a checked input, `Place` for a struct with a device
//! parameter, and `MapWeights` with an inherent `map_weights` for a struct with a weights
//! parameter. Only tokens are produced here.

use std::collections::HashSet;

use proc_macro2::{Span, TokenStream};
use quote::{quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{DeriveInput, GenericArgument, Generics, Ident, PathArguments, Type};

use crate::ast::{self, Container, Conversion, Field, mentions};
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
    let device = ast::device_param(container.generics);
    let module = module_impl(container, &private, device);
    let (place, inherent) = match device {
        Some(device) => place_impls(container, &private, device),
        None => (TokenStream::new(), TokenStream::new()),
    };
    let (map_weights, map_weights_inherent) = match ast::weights_param(container.generics) {
        Some(weights) => map_weights_impls(container, &private, device, weights),
        None => (TokenStream::new(), TokenStream::new()),
    };
    quote! {
        #[allow(unused_qualifications, clippy::all)]
        const _: () = {
            #module
            #place
            #map_weights
        };

        #inherent
        #map_weights_inherent
    }
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
    let rest = without_param(container.generics, device);
    let on_host = arguments(container.generics, &[(device, &host)]);
    let on_to = arguments(container.generics, &[(device, &to)]);

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

/// `generics` without the type parameter `param` and the `where` predicates bounding it.
pub fn without_param(generics: &Generics, param: &Ident) -> Generics {
    let mut rest = generics.clone();
    rest.params = rest
        .params
        .into_iter()
        .filter(|generic| !matches!(generic, syn::GenericParam::Type(ty) if &ty.ident == param))
        .collect();
    if let Some(clause) = &mut rest.where_clause {
        clause.predicates = clause
            .predicates
            .clone()
            .into_iter()
            .filter(|predicate| {
                !matches!(predicate, syn::WherePredicate::Type(p) if matches!(&p.bounded_ty, Type::Path(path) if path.path.is_ident(param)))
            })
            .collect();
    }
    rest
}

/// The type's arguments (`<D, W>`), each type parameter named in `with` replaced by its type.
pub fn arguments(generics: &Generics, with: &[(&Ident, &Type)]) -> TokenStream {
    let items = generics.params.iter().map(|param| match param {
        syn::GenericParam::Type(ty) => match with.iter().find(|(ident, _)| *ident == &ty.ident) {
            Some((_, with)) => quote!(#with),
            None => {
                let ident = &ty.ident;
                quote!(#ident)
            }
        },
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
}

/// For a struct with a weights parameter `W`: `MapWeights<W, V>` for its host instance
/// (`S<Host, W>` becomes `S<Host, V>`), converting each `W::Layer` field through `convert`
/// with its path, each nested module through its own `MapWeights`, the items of a container
/// through `MapEach`, and cloning every other field; and an inherent `map_weights` starting it
/// at the empty path. Returns the trait impl and the inherent impl.
fn map_weights_impls(
    container: &Container<'_>,
    private: &TokenStream,
    device: Option<&Ident>,
    weights: &Ident,
) -> (TokenStream, TokenStream) {
    let ident = container.ident;
    let host: Type = syn::parse_quote!(#private::Host);
    let to_ident = Ident::new("__NnxV", Span::call_site());
    let to: Type = syn::parse_quote!(#to_ident);
    let rest = match device {
        Some(device) => without_param(container.generics, device),
        None => container.generics.clone(),
    };
    let (from_arguments, to_arguments) = match device {
        Some(device) => (
            arguments(container.generics, &[(device, &host)]),
            arguments(container.generics, &[(device, &host), (weights, &to)]),
        ),
        None => (arguments(container.generics, &[]), arguments(container.generics, &[(weights, &to)])),
    };
    let converter = Converter { private, weights, to: &to, device, host: &host };

    let mut generics = rest.clone();
    generics.params.push(syn::parse_quote!(#to_ident: #private::Weights));
    let where_clause = generics.make_where_clause();
    let (mut members, mut converts) = (Vec::new(), false);
    for field in &container.fields {
        let (member, ty) = (&field.member, field.ty);
        let segment = field.segment();
        let path = quote!(&#private::join(__path, #segment));
        let conversion = ast::conversion(ty, weights);
        if let Conversion::Clone = conversion {
            let on_host = converter.on_host(ty);
            where_clause.predicates.push(syn::parse_quote_spanned!(ty.span()=> #on_host: ::core::clone::Clone));
        } else {
            converts = true;
        }
        let value = converter.convert(&conversion, ty, quote!(&self.#member), path);
        members.push(quote!(#member: #value));
    }
    let (impl_generics, _, where_clause) = generics.split_for_impl();
    let (uses_path, uses_convert) = if converts { (quote!(__path), quote!(__convert)) } else { (quote!(_), quote!(_)) };
    let map = quote! {
        #[automatically_derived]
        impl #impl_generics #private::MapWeights<#weights, #to_ident> for #ident #from_arguments #where_clause {
            type Mapped = #ident #to_arguments;

            fn map_weights_at(
                &self,
                #uses_path: &::core::primitive::str,
                #uses_convert: &#private::Convert<'_, #weights, #to_ident>,
            ) -> #private::Result<#ident #to_arguments> {
                ::core::result::Result::Ok(#ident { #(#members),* })
            }
        }
    };
    let (rest_impl, _, rest_where) = rest.split_for_impl();
    let inherent = quote! {
        #[automatically_derived]
        impl #rest_impl #ident #from_arguments #rest_where {
            /// This model with every projection (each field of type `W::Layer`, alone or in an
            /// `Option`, `Vec` or `Box`, here and in nested modules) turned into a layer of the
            /// weight kind `V` by `convert`, which is given the projection's model path
            /// (`layers.0.attn.q`, `lm_head`) and the layer; every other field is cloned.
            ///
            /// # Errors
            /// The first error of `convert`.
            pub fn map_weights<#to_ident: #private::Weights>(
                &self,
                convert: impl ::core::ops::Fn(
                    &::core::primitive::str,
                    &<#weights as #private::Weights>::Layer<#private::Host>,
                ) -> #private::Result<<#to_ident as #private::Weights>::Layer<#private::Host>>,
            ) -> #private::Result<#ident #to_arguments>
            where
                Self: #private::MapWeights<#weights, #to_ident, Mapped = #ident #to_arguments>,
            {
                #private::MapWeights::map_weights_at(self, "", &convert)
            }
        }
    };
    (map, inherent)
}

/// How the fields of one struct are converted: its weights parameter, the kind converted to,
/// and the device parameter that the host instance fixes to `Host`.
struct Converter<'a> {
    private: &'a TokenStream,
    weights: &'a Ident,
    to: &'a Type,
    device: Option<&'a Ident>,
    host: &'a Type,
}

impl Converter<'_> {
    /// `ty` on the host.
    fn on_host(&self, ty: &Type) -> Type {
        match self.device {
            Some(device) => substitute(ty, device, self.host),
            None => ty.clone(),
        }
    }

    /// The expression converting `value` (a reference to a value of type `ty`) at `path` (a
    /// `&str` expression), as `conversion` says; spanned on `ty`, so that a type the
    /// conversion cannot take is reported at the field.
    fn convert(&self, conversion: &Conversion<'_>, ty: &Type, value: TokenStream, path: TokenStream) -> TokenStream {
        let Converter { private, weights, to, .. } = self;
        match conversion {
            Conversion::Clone | Conversion::Unsupported => {
                quote_spanned!(ty.span()=> ::core::clone::Clone::clone(#value))
            }
            Conversion::Layer => quote_spanned!(ty.span()=> __convert(#path, #value)?),
            Conversion::Module => {
                let on_host = self.on_host(ty);
                quote_spanned!(ty.span()=>
                    <#on_host as #private::MapWeights<#weights, #to>>::map_weights_at(#value, #path, __convert)?
                )
            }
            Conversion::Each(inner, conversion) => {
                let item = self.convert(conversion, inner, quote!(__item), quote!(__path));
                let on_host = self.on_host(ty);
                quote_spanned!(ty.span()=>
                    <#on_host as #private::MapEach<_>>::map_each(#value, #path, &mut |__path: &::core::primitive::str, __item| {
                        ::core::result::Result::Ok(#item)
                    })?
                )
            }
        }
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
