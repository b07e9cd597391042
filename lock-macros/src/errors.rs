//! Error accumulation: every mistake is reported at once.

use proc_macro2::TokenStream;

/// Collects `syn::Error`s so that all of them reach the user together.
#[derive(Default)]
pub(crate) struct Errors {
    errors: Vec<syn::Error>,
}

impl Errors {
    pub(crate) fn push(&mut self, error: syn::Error) {
        self.errors.push(error);
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.errors.is_empty()
    }

    pub(crate) fn len(&self) -> usize {
        self.errors.len()
    }

    /// One `compile_error!` per message, each at its own span.
    pub(crate) fn to_compile_errors(&self) -> TokenStream {
        let mut iter = self.errors.iter().cloned();
        let Some(mut all) = iter.next() else {
            return TokenStream::new();
        };
        for e in iter {
            all.combine(e);
        }
        all.into_compile_error()
    }

    #[cfg(test)]
    pub(crate) fn into_vec(self) -> Vec<syn::Error> {
        self.errors
    }
}
