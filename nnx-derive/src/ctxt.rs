//! The error context: every attribute mistake is recorded here, so that one compile reports all
//! of them, each on its own token.

use std::cell::RefCell;
use std::fmt::Display;
use std::thread;

use quote::ToTokens;

/// Collects the errors found while parsing and checking one derive input. It is shared as
/// `&Ctxt` by everything that reports, and must be consumed by [`Ctxt::check`]: dropping it
/// unchecked is a bug in the derive and panics.
#[derive(Default)]
pub struct Ctxt {
    /// `None` once checked.
    errors: RefCell<Option<Vec<syn::Error>>>,
}

impl Ctxt {
    /// An empty context.
    pub fn new() -> Ctxt {
        Ctxt { errors: RefCell::new(Some(Vec::new())) }
    }

    /// Records an error spanning the tokens of `object`.
    pub fn error_spanned_by<T: ToTokens, M: Display>(&self, object: T, message: M) {
        self.syn_error(syn::Error::new_spanned(object.into_token_stream(), message));
    }

    /// Records an error produced by `syn`.
    pub fn syn_error(&self, error: syn::Error) {
        self.errors.borrow_mut().as_mut().expect("the context is used after `check`").push(error);
    }

    /// All recorded errors combined into one, or `Ok` when there were none.
    pub fn check(self) -> syn::Result<()> {
        let errors = self.errors.borrow_mut().take().expect("the context is checked once");
        let mut errors = errors.into_iter();
        let Some(mut combined) = errors.next() else {
            return Ok(());
        };
        for error in errors {
            combined.combine(error);
        }
        Err(combined)
    }
}

impl Drop for Ctxt {
    fn drop(&mut self) {
        if !thread::panicking() && self.errors.borrow().is_some() {
            panic!("forgot to check for errors");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collects_every_error() {
        let cx = Ctxt::new();
        cx.error_spanned_by(quote::quote!(a), "first");
        cx.error_spanned_by(quote::quote!(b), "second");
        let messages: Vec<String> = cx.check().unwrap_err().into_iter().map(|error| error.to_string()).collect();
        assert_eq!(messages, ["first", "second"]);
        assert!(Ctxt::new().check().is_ok());
    }

    #[test]
    #[should_panic(expected = "forgot to check for errors")]
    fn unchecked_context_panics() {
        let _cx = Ctxt::new();
    }
}
