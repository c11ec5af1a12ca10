//! Holds no code: the cases live in `pass/` and `fail/`, run by `tests/ui.rs`.
