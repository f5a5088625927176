//! The README's client snippet is the one `examples/readme.rs` compiles.

/// The lines of the first code block of `lang` in `text`.
fn first_block<'a>(text: &'a str, fence: &str) -> Vec<&'a str> {
    let start = text.find(fence).expect("the README has a rust block") + fence.len();
    let body = &text[start..];
    let end = body.find("```").expect("the block is closed");
    body[..end].lines().collect()
}

#[test]
fn the_readme_snippet_is_the_compiled_example() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let readme = std::fs::read_to_string(format!("{root}/README.md")).expect("README.md");
    let example =
        std::fs::read_to_string(format!("{root}/client/examples/readme.rs")).expect("example");
    let snippet: Vec<&str> = first_block(&readme, "```rust\n")
        .into_iter()
        .filter(|l| !l.trim().is_empty())
        .collect();
    let begin = example.find("// README BEGIN\n").expect("begin marker") + 16;
    let end = example.find("// README END").expect("end marker");
    let compiled: Vec<&str> = example[begin..end]
        .lines()
        .map(|l| l.strip_prefix("    ").unwrap_or(l))
        .filter(|l| !l.trim().is_empty())
        .collect();
    assert_eq!(
        snippet, compiled,
        "the README's rust block and examples/readme.rs differ: update both"
    );
}
