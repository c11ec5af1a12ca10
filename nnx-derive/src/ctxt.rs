//! The error context: every attribute mistake is recorded here, so that one compile reports all
//! of them, each on its own token.

use std::fmt::Display;

use quote::ToTokens;

/// Collects the errors found while parsing and checking one derive input.
#[derive(Default)]
pub struct Ctxt {
    errors: Vec<syn::Error>,
}

impl Ctxt {
    /// An empty context.
    pub fn new() -> Ctxt {
        Ctxt::default()
    }

    /// Records an error spanning the tokens of `object`.
    pub fn error_spanned_by<T: ToTokens, M: Display>(&mut self, object: T, message: M) {
        self.errors.push(syn::Error::new_spanned(object.into_token_stream(), message));
    }

    /// Records an error produced by `syn`.
    pub fn syn_error(&mut self, error: syn::Error) {
        self.errors.push(error);
    }

    /// All recorded errors combined into one, or `Ok` when there were none.
    pub fn check(self) -> syn::Result<()> {
        let mut errors = self.errors.into_iter();
        let Some(mut combined) = errors.next() else {
            return Ok(());
        };
        for error in errors {
            combined.combine(error);
        }
        Err(combined)
    }
}
