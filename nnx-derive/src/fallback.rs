//! The stub impls emitted beside compile errors (`Module`, and for a struct with a weights
//! parameter `MapWeights` and `map_weights`), so that a mistake in the attributes shows as that
//! mistake alone and not also as "`Module` is not implemented" wherever the type is used.

use proc_macro2::{Span, TokenStream};
use quote::quote;
use syn::{DeriveInput, Ident, Type};

use crate::ast;
use crate::expand::{arguments, without_param};

/// `Module` with empty walks, holding tensors as far as import attributes can tell, for any
/// struct, enum or union, without bounds beyond those the type declares.
pub fn impls(input: &DeriveInput, krate: &TokenStream) -> TokenStream {
    let private = quote!(#krate::__private);
    let ident = &input.ident;
    let (impl_generics, ty_generics, where_clause) = input.generics.split_for_impl();
    let map_weights = ast::weights_param(&input.generics).map(|weights| map_weights(input, &private, weights));
    quote! {
        #map_weights

        #[allow(unused_qualifications, clippy::all)]
        const _: () = {
            #[automatically_derived]
            #[diagnostic::do_not_recommend]
            impl #impl_generics #private::Module for #ident #ty_generics #where_clause {
                fn walk(&self, _: &mut dyn #private::Visitor) {}

                fn walk_mut(&mut self, _: &mut dyn #private::VisitorMut) {}
            }
        };
    }
}

/// `MapWeights` and `map_weights` for a struct with a weights parameter, never run, so that a
/// model converted elsewhere does not also fail.
fn map_weights(input: &DeriveInput, private: &TokenStream, weights: &Ident) -> TokenStream {
    let ident = &input.ident;
    let host: Type = syn::parse_quote!(#private::Host);
    let to_ident = Ident::new("__NnxV", Span::call_site());
    let to: Type = syn::parse_quote!(#to_ident);
    let device = ast::device_param(&input.generics);
    let (rest, from_arguments, to_arguments) = match device {
        Some(device) => (
            without_param(&input.generics, device),
            arguments(&input.generics, &[(device, &host)]),
            arguments(&input.generics, &[(device, &host), (weights, &to)]),
        ),
        None => {
            (input.generics.clone(), arguments(&input.generics, &[]), arguments(&input.generics, &[(weights, &to)]))
        }
    };
    let mut generics = rest.clone();
    generics.params.push(syn::parse_quote!(#to_ident: #private::Weights));
    let (impl_generics, _, where_clause) = generics.split_for_impl();
    let (rest_impl, _, rest_where) = rest.split_for_impl();
    quote! {
        #[allow(unused_qualifications, clippy::all)]
        const _: () = {
            #[automatically_derived]
            impl #impl_generics #private::MapWeights<#weights, #to_ident> for #ident #from_arguments #where_clause {
                type Mapped = #ident #to_arguments;

                fn map_weights_at(
                    &self,
                    _: &::core::primitive::str,
                    _: &#private::Convert<'_, #weights, #to_ident>,
                ) -> #private::Result<#ident #to_arguments> {
                    ::core::unreachable!()
                }
            }
        };

        #[automatically_derived]
        #[allow(clippy::all)]
        impl #rest_impl #ident #from_arguments #rest_where {
            #[doc(hidden)]
            pub fn map_weights<#to_ident: #private::Weights>(
                &self,
                _: impl ::core::ops::Fn(
                    &::core::primitive::str,
                    &<#weights as #private::Weights>::Layer<#private::Host>,
                ) -> #private::Result<<#to_ident as #private::Weights>::Layer<#private::Host>>,
            ) -> #private::Result<#ident #to_arguments> {
                ::core::unreachable!()
            }
        }
    }
}
