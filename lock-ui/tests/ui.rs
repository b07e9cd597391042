//! The macro's expansions that must compile and the mistakes that must not,
//! with their messages (trybuild). No server: `.ci/run` runs it in its first
//! pass only (`--skip trybuild` in the passes on other servers).

#[test]
fn trybuild_macro_expansions_compile_and_mistakes_fail() {
    let t = trybuild::TestCases::new();
    t.pass("tests/ui/pass/*.rs");
    t.compile_fail("tests/ui/fail/*.rs");
}
