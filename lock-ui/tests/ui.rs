//! The macro's mistakes that must not compile, with their messages
//! (trybuild). The expansions that must compile are test targets of their own
//! (`tests/ui/pass/*.rs`, each a `[[test]]` of this package's manifest), built
//! with the workspace's dependencies: trybuild checks a project of fail cases
//! alone (`cargo check`), where one pass case made it build every dependency
//! in its own target directory (143 s against 58 s at d60a5c4). No server:
//! `.ci/run` runs it in its first pass only (the passes on other servers
//! select their suites by name).

#[test]
fn trybuild_macro_mistakes_fail_with_their_messages() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/fail/*.rs");
}
