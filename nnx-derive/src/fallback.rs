//! The stub impls emitted beside compile errors, so that a mistake in the attributes shows as
//! that mistake alone and not also as "`Module` is not implemented" wherever the type is used.

use proc_macro2::TokenStream;
use quote::quote;
use syn::DeriveInput;

/// `Module` with empty walks, holding tensors as far as import attributes can tell, for any
/// struct, enum or union, without bounds beyond those the type declares.
pub fn impls(input: &DeriveInput, krate: &TokenStream) -> TokenStream {
    let private = quote!(#krate::__private);
    let ident = &input.ident;
    let (impl_generics, ty_generics, where_clause) = input.generics.split_for_impl();
    quote! {
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
