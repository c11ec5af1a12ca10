//! Runs the derive's compile-pass cases (`pass/*.rs`, compiled and run) and compile-fail cases
//! (`fail/<class>/*.rs`, whose errors must match the blessed `.stderr` beside each).

#[test]
fn ui() {
    let cases = trybuild::TestCases::new();
    cases.pass("pass/*.rs");
    cases.compile_fail("fail/*/*.rs");
}
