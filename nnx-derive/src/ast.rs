//! The derive input as plain data: the struct, its fields and their parsed attributes.

use syn::ext::IdentExt;
use syn::{DeriveInput, Generics, Ident, Member, Type};

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
