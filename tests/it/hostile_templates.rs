//! Hostile chat templates: small templates that ask for huge output, deep recursion or unbounded
//! work, each refused by name within the renderer's bounds. The ones that reach `nnx run` go in
//! a copy of the tiny `models/llama3` fixture whose `tokenizer_config.json` holds the template,
//! and run the binary under an address-space limit and a timeout, printing the peak memory and
//! time of each; the others are rendered through the library.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nnx::Error;
use nnx::generate::{ChatTemplate, Message};
use nnx::gguf::{Metadata, Value};

use crate::util::{Bounded, fixtures, run_nnx_bounded, scratch, text};

/// The address space each run may use.
const MEMORY: u64 = 3 << 30;

/// How long a run may take.
const TIMEOUT: Duration = Duration::from_secs(60);

/// What every refusal from a folder names: the file and its entry.
const ENTRY: &str = "tokenizer_config.json` entry `chat_template`";

/// A copy of the `models/llama3` fixture (weights, tokenizer, configuration) whose
/// `tokenizer_config.json` has `template` as its `chat_template`.
fn model_with_template(dir: &Path, template: &str) -> PathBuf {
    let source = fixtures().join("models").join("llama3");
    let model = dir.join("model");
    std::fs::create_dir_all(&model).unwrap();
    for name in ["config.json", "generation_config.json", "model.safetensors", "tokenizer.json"] {
        std::fs::copy(source.join(name), model.join(name)).unwrap();
    }
    let config = std::fs::read_to_string(source.join("tokenizer_config.json")).unwrap();
    let mut config: serde_json::Value = serde_json::from_str(&config).unwrap();
    config["chat_template"] = serde_json::Value::String(template.into());
    std::fs::write(model.join("tokenizer_config.json"), config.to_string()).unwrap();
    model
}

/// Runs `nnx run --chat` on the model of `template` under [`MEMORY`] and [`TIMEOUT`], printing
/// its peak memory and time as `case`.
fn run(case: &str, template: &str) -> Bounded {
    let dir = scratch();
    let model = model_with_template(dir.path(), template);
    let args = ["run", text(&model), "--chat", "--prompt", "hi", "--max-new-tokens", "2"];
    let start = Instant::now();
    let bounded = run_nnx_bounded(&args, &[], MEMORY, TIMEOUT);
    eprintln!(
        "{case} ({} bytes): peak_memory {} MiB, {:.2} s",
        template.len(),
        bounded.peak_memory >> 20,
        start.elapsed().as_secs_f64()
    );
    bounded
}

/// Runs `template` and asserts it is refused naming the entry, with `words` in the error line.
fn refused(case: &str, template: &str, words: &str) {
    let bounded = run(case, template);
    bounded.assert_refused(ENTRY);
    let error = bounded.stderr.lines().find(|line| line.starts_with("error:")).unwrap_or_default();
    assert!(error.contains(words), "{case}: the error says `{words}`: {error}");
}

/// A namespace list doubled 48 times over (each level holds the one below twice: 2^48 items
/// if walked), then `tail`.
fn doubled(tail: &str) -> String {
    format!(
        "{{% set ns = namespace(a=[1], b=[1]) %}}{{% for i in range(48) %}}{{% set ns.a = [ns.a, ns.a] %}}\
         {{% set ns.b = [ns.b, ns.b] %}}{{% endfor %}}{tail}"
    )
}

#[test]
fn hostile_templates_huge_strings_are_refused_by_name() {
    // 20 bytes that ask for a 20 MB prompt, and a string repeated 10^12 times.
    refused("repeat 2e7", "{{ 'x' * 20000000 }}", "fuel");
    refused("repeat 1e12", "{{ 'x' * 10**12 }}", "fuel");
    refused("repeat into a variable", "{% set y = 'x' * 20000000 %}ok", "fuel");
    refused(
        "doubling concatenation",
        "{% set s = namespace(v='x') %}{% for i in range(40) %}{% set s.v = s.v ~ s.v %}{% endfor %}{{ s.v }}",
        "fuel",
    );
    // Within the fuel, past the prompt's size.
    refused("a 5 MB prompt", "{{ 'x' * 5000000 }}", "passed the 4194304 bytes");
}

#[test]
fn hostile_templates_self_referential_lists_are_bounded() {
    for (case, tail, words) in [
        ("tojson", "{{ ns.a|tojson }}", "fuel"),
        ("printed", "{{ ns.a }}", "fuel"),
        ("string", "{{ ns.a|string|length }}", "fuel"),
        ("join", "{{ ns.a|join }}", "fuel"),
        ("pprint", "{{ ns.a|pprint }}", "fuel"),
        ("sort", "{{ [ns.a, ns.b]|sort|length }}", "fuel"),
        ("unique", "{{ [ns.a, ns.b]|unique|length }}", "fuel"),
        ("map string", "{{ ns.a|map('string')|list|length }}", "fuel"),
        ("format", "{{ '%s'|format(ns.a) }}", "fuel"),
        ("str.join", "{{ ','.join(ns.a) }}", "fuel"),
        ("raise_exception", "{{ raise_exception(ns.a) }}", "fuel"),
    ] {
        refused(&format!("doubled list, {case}"), &doubled(tail), words);
    }
    // The same without a namespace: 48 statements at the top level.
    let mut source = "{% set a = [1] %}".to_string();
    for _ in 0..48 {
        source.push_str("{% set a = [a, a] %}");
    }
    source.push_str("{{ a|tojson }}");
    refused("doubled list at the top level, tojson", &source, "fuel");
    // A `set` in a loop is the loop's own (Jinja's scoping): the list stays `[1]`.
    let scoped = "{% set a = [1] %}{% for i in range(48) %}{% set a = [a, a] %}{% endfor %}{{ a|tojson }}";
    let bounded = run("doubled list in a loop's scope, tojson", scoped);
    assert_eq!(bounded.code, Some(0), "{}", bounded.stderr);
    // Its length is its top level's: a normal result.
    let bounded = run("doubled list, length", &doubled("{{ ns.a|length }}"));
    assert_eq!(bounded.code, Some(0), "{}", bounded.stderr);
}

#[test]
fn hostile_templates_walks_that_cost_no_fuel_stop_at_the_deadline() {
    // Concatenating prints the list in the engine, which charges no fuel: the deadline stops it.
    refused("doubled list, concatenated", &doubled("{{ ns.a ~ '' }}"), "did not finish within the 5 s");
}

#[test]
fn hostile_templates_deep_nesting_does_not_overflow_the_stack() {
    let deep = |open: &str, close: &str| format!("{{{{ {}1{} }}}}", open.repeat(100_000), close.repeat(100_000));
    refused("list nested 100,000 deep", &deep("[", "]"), "nests too deeply");
    refused("parentheses 100,000 deep", &deep("(", ")"), "nests too deeply");
    refused("100,000 `not`", &deep("not ", ""), "nests too deeply");
    refused("100,000 unary minus", &deep("-", ""), "nests too deeply");
    refused("100,000 filters", &format!("{{{{ 1{} }}}}", "|abs".repeat(100_000)), "nests too deeply");
    refused("100,000 additions", &format!("{{{{ 1{} }}}}", "+1".repeat(100_000)), "nests too deeply");
    refused("100,000 attributes", &format!("{{{{ a{} }}}}", ".b".repeat(100_000)), "nests too deeply");
    refused(
        "20,000 nested ifs",
        &format!("{}{}", "{% if true %}".repeat(20_000), "{% endif %}".repeat(20_000)),
        "recursion limits",
    );
    // A value nested 140,000 deep by a loop (70 levels an iteration, about as deep as the fuel
    // lets a template nest one): printed, compared and dropped on the render thread's own stack.
    let nested = format!(
        "{{% set ns = namespace(a=1) %}}{{% for i in range(2000) %}}{{% set ns.a = {}ns.a{} %}}{{% endfor %}}",
        "[".repeat(70),
        "]".repeat(70)
    );
    // Printing it is refused by name before the engine recurses through it; comparing and
    // dropping it give a result or a clean error.
    refused("value nested 140,000 deep, printed", &format!("{nested}{{{{ ns.a }}}}"), "nests too deeply");
    for (case, tail) in [("compared", "{{ ns.a == ns.a }}"), ("dropped", "")] {
        let bounded = run(&format!("value nested 140,000 deep, {case}"), &format!("{nested}{tail}"));
        if bounded.code != Some(0) {
            bounded.assert_refused(ENTRY);
        }
    }
    refused("value nested 140,000 deep, tojson", &format!("{nested}{{{{ ns.a|tojson }}}}"), "nests too deeply");
}

#[test]
fn hostile_templates_loops_and_recursion_are_bounded() {
    for (case, template, words) in [
        ("range 10^9", "{% for i in range(10**9) %}{% endfor %}", "too many elements"),
        ("nested ranges", "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}", "fuel"),
        (
            "namespace counter",
            "{% set n = namespace(c=0) %}{% for a in range(99999) %}{% for b in range(99999) %}\
             {% set n.c = n.c + 1 %}{% endfor %}{% endfor %}{{ n.c }}",
            "fuel",
        ),
        ("recursive loop", "{% for x in [[1]] recursive %}{{ loop([x]) }}{% endfor %}", "recursion limit"),
        ("macro calling itself", "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "recursion limit"),
        ("macro calling itself twice", "{% macro f() %}{{ f() }}{{ f() }}{% endmacro %}{{ f() }}", "recursion limit"),
        (
            "filter block",
            "{% filter upper %}{% for a in range(99999) %}{% for b in range(99999) %}xxxxxxxxxx{% endfor %}\
             {% endfor %}{% endfilter %}",
            "fuel",
        ),
        ("join of a huge range", "{{ range(10**8)|join(',') }}", "too many elements"),
    ] {
        refused(case, template, words);
    }
}

#[test]
fn hostile_templates_widths_and_growing_filters_are_refused() {
    for (case, template, words) in [
        ("printf width", "{{ '%999999999d'|format(1) }}", "`format` width"),
        ("printf precision", "{{ '%.999999999f'|format(1.5) }}", "`format` width"),
        ("printf star width", "{{ '%*d'|format(999999999, 1) }}", "`format` width"),
        ("str.format width", "{{ '{:>999999999}'.format(1) }}", "`format` width"),
        ("indent", "{{ 'a\nb'|indent(10**9) }}", "`indent`"),
        ("indent by a string", "{{ ('a\n' * 1000)|indent('x' * 100000) }}", "`indent`"),
        ("str.replace", "{{ ('x' * 10000).replace('x', 'x' * 1000000) }}", "`str.replace`"),
        ("replace filter", "{{ ('x' * 100000)|replace('x', 'y' * 100000) }}", "fuel"),
        ("str.split into characters", "{{ ('x' * 10**7).split('') }}", "fuel"),
        ("raise_exception of a huge message", "{{ raise_exception('x' * 10**9) }}", "fuel"),
        ("strftime_now of a huge format", "{{ strftime_now('%c' * 100000) }}", "`strftime_now`"),
    ] {
        refused(case, template, words);
    }
}

#[test]
fn hostile_templates_huge_sources_are_refused_before_compiling() {
    let source = format!("{{# {} #}}", "x".repeat(2 << 20));
    refused("a 2 MiB template", &source, "past the 1048576 nnx compiles");
}

#[test]
fn hostile_templates_in_gguf_metadata_name_the_key() {
    let mut metadata = Metadata::new();
    metadata.set("tokenizer.chat_template", Value::String("{{ 'x' * 20000000 }}".into()));
    let template = ChatTemplate::from_gguf(&metadata).unwrap().expect("a template");
    let error = template.render(&[Message::new("user", "hi")], true).unwrap_err();
    assert!(matches!(error, Error::Template { failure: "runs too long", .. }), "{error:?}");
    assert!(error.to_string().contains("`tokenizer.chat_template`"), "{error}");

    metadata.set("tokenizer.chat_template", Value::String(format!("{{{{ {} }}}}", "-".repeat(100_000))));
    let error = ChatTemplate::from_gguf(&metadata).unwrap_err();
    assert!(error.to_string().contains("`tokenizer.chat_template` (line 1) nests too deeply"), "{error}");
}

#[test]
fn hostile_templates_real_conversations_stay_within_the_bounds() {
    // A thousand turns of 2 KB each (about half a million tokens) through each published
    // template: the work they need, far under the fuel and the prompt's size.
    let mut messages = vec![Message::new("system", "You are helpful.")];
    for turn in 0..1000 {
        let role = if turn % 2 == 0 { "user" } else { "assistant" };
        messages.push(Message::new(role, "Hello there, how are you? ".repeat(80)));
    }
    messages.pop();
    for name in
        ["gemma-3-it", "llama-3.1-8b-instruct", "mistral-nemo-instruct-2407", "qwen2.5-7b-instruct", "qwen3-0.6b"]
    {
        let source = std::fs::read_to_string(fixtures().join("chat").join(format!("{name}.jinja"))).unwrap();
        let template = ChatTemplate::new(&source, "<s>", "</s>").unwrap();
        let prompt = template.render(&messages, true).unwrap_or_else(|error| panic!("{name}: {error}"));
        assert!(prompt.len() > 2_000_000, "{name}: {} bytes", prompt.len());
    }
}
