//! The generated code is immune to a scope that shadows the prelude's names.

#![allow(dead_code, non_camel_case_types, non_upper_case_globals)]

mod shadowed {
    type Result = ();
    pub struct Option;
    struct Vec;
    struct Box;
    struct Some;
    struct None;
    struct Module;
    struct Place;
    trait Visitor {}
    struct usize;
    struct isize;
    struct bool;
    struct str;
    const visitor: () = ();

    #[derive(nnx::Module)]
    pub struct Model {
        #[nnx(from = "c_attn", split(axis = -1, parts = 2, index = 0), transpose, optional, dtype = "f32")]
        pub first: nnx::Tensor,
        #[nnx(from = "c_attn", split(axis = -1, parts = 2, index = 1))]
        pub second: nnx::Tensor,
        #[nnx(tie = "first")]
        pub tied: nnx::Tensor,
        #[nnx(skip)]
        pub config: Option,
    }

    pub fn model() -> Model {
        let tensor = || nnx::Tensor::zeros(nnx::DType::F32, &[2, 2]);
        Model { first: tensor(), second: tensor(), tied: tensor(), config: Option }
    }
}

fn main() {
    use nnx::Module;
    let keys: Vec<String> = shadowed::model().flat_state_dict().keys().map(str::to_string).collect();
    assert_eq!(keys, ["first", "second", "tied"]);
}
