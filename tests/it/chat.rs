//! Chat templates rendered by nnx and by Python's `jinja2` set up as transformers'
//! `apply_chat_template` sets it up, compared byte for byte: the published templates of
//! `tests/fixtures/chat/` over conversations with and without a system message, with and
//! without the generation prompt; the template's own refusals and syntax errors; and a template
//! read back from a GGUF file and from model folders.
//!
//! The interpreter (see `crate::python::interpreter`) must import `jinja2`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use nnx::generate::{ChatTemplate, Message};
use nnx::gguf::{Array, GgufWriter, Value};
use nnx::{Archive, Error};
use serde_json::{Value as Json, json};

use crate::python::interpreter;
use crate::util::{fixtures, scratch};

/// The Python side: reads a list of cases (`template`, `messages`, `add_generation_prompt`,
/// `tokens`) from standard input, renders each in transformers' environment (as
/// `transformers.utils.chat_template_utils._compile_jinja_template` builds it, with its
/// `AssistantTracker` reduced to what it does when no mask is asked for) with the variables
/// `apply_chat_template` passes, and prints `{"text": ...}` or `{"error": ...}` for each.
const SCRIPT: &str = r#"
import json, sys
from datetime import datetime

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment


class AssistantTracker(jinja2.ext.Extension):
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render_assistant", []), [], [], body).set_lineno(lineno)

    def _render_assistant(self, caller):
        return caller()


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def strftime_now(format):
    return datetime.now().strftime(format)


env = ImmutableSandboxedEnvironment(
    trim_blocks=True, lstrip_blocks=True, extensions=[AssistantTracker, jinja2.ext.loopcontrols]
)
env.filters["tojson"] = tojson
env.globals["raise_exception"] = raise_exception
env.globals["strftime_now"] = strftime_now

results = []
for case in json.load(sys.stdin):
    try:
        template = env.from_string(case["template"])
        # A tokenizer's special_tokens_map holds only the tokens it has.
        tokens = {name: token for name, token in case["tokens"].items() if token}
        # Messages as a caller writes them, role first (the JSON read here has sorted keys).
        messages = [{"role": message["role"], "content": message["content"]} for message in case["messages"]]
        text = template.render(
            messages=messages,
            tools=None,
            documents=None,
            add_generation_prompt=case["add_generation_prompt"],
            **tokens,
        )
        results.append({"text": text})
    except Exception as error:
        results.append({"error": f"{type(error).__name__}: {error}"})
print(json.dumps(results))
"#;

/// One rendering to compare.
struct Case {
    template: String,
    bos: &'static str,
    eos: &'static str,
    messages: Vec<Message>,
    add_generation_prompt: bool,
}

/// Renders every case in Python, in one run; `Ok(text)` or `Err(error)` per case.
fn python_render(cases: &[Case]) -> Vec<Result<String, String>> {
    let input: Vec<Json> = cases
        .iter()
        .map(|case| {
            json!({
                "template": case.template,
                "messages": case.messages.iter().map(|m| json!({"role": m.role, "content": m.content})).collect::<Vec<_>>(),
                "add_generation_prompt": case.add_generation_prompt,
                "tokens": {"bos_token": case.bos, "eos_token": case.eos},
            })
        })
        .collect();
    let python = interpreter();
    let mut child = Command::new(&python)
        .arg("-c")
        .arg(SCRIPT)
        // `strftime_now` reads the local time, nnx's is UTC.
        .env("TZ", "UTC")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|error| panic!("`{python}` cannot be run: {error}; run `scripts/setup.sh`"));
    let stdin = child.stdin.take().expect("a pipe");
    let writer = std::thread::spawn(move || {
        let mut stdin = stdin;
        serde_json::to_writer(&mut stdin, &input).expect("the script reads its input");
    });
    let output = child.wait_with_output().expect("the script runs");
    writer.join().expect("the input is written");
    assert!(
        output.status.success(),
        "the jinja2 reference failed (it needs `jinja2`: run `scripts/setup.sh`, or `pip install jinja2` and set NNX_PYTHON):\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let results: Vec<Json> = serde_json::from_slice(&output.stdout).expect("the script prints JSON");
    results
        .into_iter()
        .map(|result| match (result.get("text"), result.get("error")) {
            (Some(Json::String(text)), _) => Ok(text.clone()),
            (_, Some(Json::String(error))) => Err(error.clone()),
            _ => panic!("unexpected result {result}"),
        })
        .collect()
}

fn fixture(name: &str) -> String {
    let path = fixtures().join("chat").join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|error| panic!("{}: {error}", path.display()))
}

/// A conversation with a system message, a thought in the assistant's answer, surrounding
/// whitespace, quotes, backslashes, markup and text past ASCII (one character past the BMP).
fn with_system() -> Vec<Message> {
    vec![
        Message::new("system", "You are a terse assistant.\nAnswer in one line."),
        Message::new("user", "  Hello! Can you say \"hi\" in German & Chinese? <b>please</b>  "),
        Message::new("assistant", "<think>\nThe user wants greetings.\n</think>\n\nHallo! 你好 \u{1F600} (C:\\path)"),
        Message::new("user", "Thanks.\tAnd in French?"),
    ]
}

/// The same without the system message.
fn without_system() -> Vec<Message> {
    with_system().split_off(1)
}

/// The published templates (file, bos, eos) and the end-of-turn markers their prompts must stop on.
const TEMPLATES: &[(&str, &str, &str, &[&str])] = &[
    ("llama-3.1-8b-instruct.jinja", "<|begin_of_text|>", "<|eot_id|>", &["<|eot_id|>", "<|eom_id|>"]),
    ("qwen2.5-7b-instruct.jinja", "", "<|im_end|>", &["<|im_end|>"]),
    ("gemma-3-it.jinja", "<bos>", "<eos>", &["<eos>", "<end_of_turn>"]),
    ("mistral-nemo-instruct-2407.jinja", "<s>", "</s>", &["</s>"]),
    ("qwen3-0.6b.jinja", "", "<|im_end|>", &["<|im_end|>"]),
    ("smollm3-3b.jinja", "", "<|im_end|>", &["<|im_end|>"]),
    ("tojson-methods.jinja", "<s>", "</s>", &["</s>"]),
    // Harmony: `<|end|>` closes the analysis message, and the turn goes on to the final one.
    ("gpt-oss-120b.jinja", "<|startoftext|>", "<|return|>", &["<|return|>", "<|call|>"]),
    // Gemma 4: `<|turn>role` ... `<turn|>`, an empty thought channel before the answer.
    ("gemma-4-31b-it.jinja", "<bos>", "<eos>", &["<eos>", "<turn|>"]),
];

#[test]
fn published_templates_render_as_transformers_renders_them() {
    let mut cases = Vec::new();
    for &(name, bos, eos, _) in TEMPLATES {
        for messages in [with_system(), without_system()] {
            for add_generation_prompt in [false, true] {
                cases.push(Case {
                    template: fixture(name),
                    bos,
                    eos,
                    messages: messages.clone(),
                    add_generation_prompt,
                });
            }
        }
    }
    let expected = python_render(&cases);
    for (case, expected) in cases.iter().zip(expected) {
        let what = format!(
            "{} ({} messages, add_generation_prompt {})",
            TEMPLATES.iter().find(|t| fixture(t.0) == case.template).map_or("?", |t| t.0),
            case.messages.len(),
            case.add_generation_prompt
        );
        let expected = expected.unwrap_or_else(|error| panic!("{what}: jinja2 refused it: {error}"));
        let template = ChatTemplate::new(&case.template, case.bos, case.eos).unwrap();
        let ours =
            template.render(&case.messages, case.add_generation_prompt).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(ours, expected, "{what}");
    }
}

#[test]
fn renderings_show_each_family_markers() {
    let render = |name: &str, bos: &str, eos: &str, messages: &[Message]| {
        ChatTemplate::new(&fixture(name), bos, eos).unwrap().render(messages, true).unwrap()
    };
    let llama = render("llama-3.1-8b-instruct.jinja", "<|begin_of_text|>", "<|eot_id|>", &with_system());
    assert!(llama.starts_with("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"), "{llama}");
    assert!(llama.ends_with("And in French?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"), "{llama}");
    let qwen = render("qwen2.5-7b-instruct.jinja", "", "<|im_end|>", &without_system());
    assert!(
        qwen.starts_with(
            "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
        ),
        "{qwen}"
    );
    let gemma = render("gemma-3-it.jinja", "<bos>", "<eos>", &with_system());
    assert!(gemma.starts_with("<bos><start_of_turn>user\nYou are a terse assistant."), "{gemma}");
    assert!(gemma.ends_with("<end_of_turn>\n<start_of_turn>model\n"), "{gemma}");
    let mistral = render("mistral-nemo-instruct-2407.jinja", "<s>", "</s>", &with_system());
    assert!(mistral.starts_with("<s>[INST]"), "{mistral}");
    assert!(mistral.ends_with("Answer in one line.\n\nThanks.\tAnd in French?[/INST]"), "{mistral}");
}

#[test]
fn stop_strings_are_the_end_of_turn_markers_the_template_emits() {
    for &(name, bos, eos, stops) in TEMPLATES {
        let template = ChatTemplate::new(&fixture(name), bos, eos).unwrap();
        assert_eq!(template.stop_strings(), stops, "{name}");
    }
}

#[test]
fn raise_exception_surfaces_the_template_message() {
    let source = fixture("gemma-3-it.jinja");
    let messages = vec![Message::new("user", "one"), Message::new("user", "two")];
    let reference = python_render(&[Case {
        template: source.clone(),
        bos: "<bos>",
        eos: "<eos>",
        messages: messages.clone(),
        add_generation_prompt: true,
    }]);
    let [Err(python)] = reference.as_slice() else { panic!("jinja2 rendered it: {reference:?}") };
    let said = "Conversation roles must alternate user/assistant/user/assistant/...";
    assert_eq!(python, &format!("TemplateError: {said}"));

    let template = ChatTemplate::new(&source, "<bos>", "<eos>").unwrap();
    let error = template.render(&messages, true).unwrap_err();
    let Error::Template { ref origin, line, failure, ref message, .. } = error else { panic!("{error:?}") };
    assert_eq!(message, said);
    assert_eq!(failure, "refused the conversation");
    assert_eq!(origin, "the given source");
    assert_eq!(line, Some(19), "the line of the raise_exception call");
    let text = error.to_string();
    assert!(text.contains(said) && text.contains("line 19") && text.contains("change the messages"), "{text}");

    // Mistral's refuses roles it does not know.
    let template = ChatTemplate::new(&fixture("mistral-nemo-instruct-2407.jinja"), "<s>", "</s>").unwrap();
    let error = template.render(&[Message::new("user", "a"), Message::new("tool", "b")], false).unwrap_err();
    assert!(error.to_string().contains("Tool call IDs should be alphanumeric strings with length 9!"), "{error}");
}

#[test]
fn syntax_errors_name_the_line() {
    let source = "{% for message in messages %}\n{{ message.content }}\n{% if message.role %}\n{% endfor %}";
    let python = python_render(&[Case {
        template: source.into(),
        bos: "",
        eos: "",
        messages: vec![],
        add_generation_prompt: false,
    }]);
    assert!(matches!(&python[0], Err(error) if error.starts_with("TemplateSyntaxError")), "{python:?}");
    let error = ChatTemplate::new(source, "", "").unwrap_err();
    let Error::Template { line, failure, ref message, .. } = error else { panic!("{error:?}") };
    assert_eq!(failure, "does not compile");
    assert_eq!(line, Some(4));
    assert!(message.starts_with("syntax error"), "{message}");
    assert!(error.to_string().contains("(line 4) does not compile"), "{error}");

    let error = ChatTemplate::new("{{ messages | tojson(indent=2, nope=1) }}", "", "")
        .unwrap()
        .render(&with_system(), false)
        .unwrap_err();
    assert!(matches!(error, Error::Template { failure: "failed to render", .. }), "{error:?}");
}

#[test]
fn undefined_tokens_stay_undefined() {
    let template =
        ChatTemplate::new("{{ bos_token is defined }}|{{ eos_token }}|{{ tools is none }}", "", "</s>").unwrap();
    assert_eq!(template.render(&[], false).unwrap(), "False|</s>|True");
}

/// A GGUF file holding the Llama 3.1 template, its tokens and the ids of bos and eos.
fn write_gguf(path: &Path, source: &str) {
    let mut writer = GgufWriter::new();
    let metadata = writer.metadata_mut();
    metadata.set("general.architecture", Value::String("llama".into()));
    let tokens = vec!["<unk>".into(), "<|begin_of_text|>".into(), "<|end_of_text|>".into(), "<|eot_id|>".into()];
    metadata.set("tokenizer.ggml.tokens", Value::Array(Array::String(tokens)));
    metadata.set("tokenizer.ggml.bos_token_id", Value::U32(1));
    metadata.set("tokenizer.ggml.eos_token_id", Value::U32(3));
    metadata.set("tokenizer.chat_template", Value::String(source.into()));
    writer.write(path).unwrap();
}

#[test]
fn gguf_templates_render_the_same() {
    let dir = scratch();
    let path = dir.path().join("chat.gguf");
    let source = fixture("llama-3.1-8b-instruct.jinja");
    write_gguf(&path, &source);
    let archive = Archive::open(&path).unwrap();
    let metadata = archive.gguf_metadata().expect("a GGUF file");
    let from_gguf = ChatTemplate::from_gguf(metadata).unwrap().expect("the file has a template");
    let direct = ChatTemplate::new(&source, "<|begin_of_text|>", "<|eot_id|>").unwrap();
    for add_generation_prompt in [false, true] {
        assert_eq!(
            from_gguf.render(&with_system(), add_generation_prompt).unwrap(),
            direct.render(&with_system(), add_generation_prompt).unwrap()
        );
    }
    assert_eq!(from_gguf.stop_strings(), ["<|eot_id|>", "<|eom_id|>"]);
    let python = python_render(&[Case {
        template: source,
        bos: "<|begin_of_text|>",
        eos: "<|eot_id|>",
        messages: with_system(),
        add_generation_prompt: true,
    }]);
    assert_eq!(python[0].as_deref(), Ok(from_gguf.render(&with_system(), true).unwrap().as_str()));

    let mut empty = nnx::gguf::Metadata::new();
    assert!(ChatTemplate::from_gguf(&empty).unwrap().is_none());
    empty.set("tokenizer.chat_template", Value::U32(1));
    let error = ChatTemplate::from_gguf(&empty).unwrap_err();
    assert!(error.to_string().contains("`tokenizer.chat_template`"), "{error}");
}

fn folder(files: &[(&str, String)]) -> (tempfile::TempDir, PathBuf) {
    let dir = scratch();
    let path = dir.path().to_path_buf();
    for (name, text) in files {
        std::fs::write(path.join(name), text).unwrap();
    }
    (dir, path)
}

#[test]
fn folders_are_read_as_transformers_reads_them() {
    let gemma = fixture("gemma-3-it.jinja");
    let expected = ChatTemplate::new(&gemma, "<bos>", "<eos>").unwrap().render(&with_system(), true).unwrap();

    // A string, with tokens as objects with a content.
    let config = json!({
        "bos_token": {"content": "<bos>", "lstrip": false},
        "eos_token": "<eos>",
        "chat_template": gemma,
    });
    let (_dir, path) = folder(&[("tokenizer_config.json", config.to_string())]);
    let template = ChatTemplate::from_folder(&path).unwrap().expect("a template");
    assert_eq!(template.render(&with_system(), true).unwrap(), expected);

    // A list of named templates: the default one.
    let config = json!({
        "bos_token": "<bos>",
        "eos_token": "<eos>",
        "chat_template": [{"name": "tool_use", "template": "tools"}, {"name": "default", "template": gemma}],
    });
    let (_dir, path) = folder(&[("tokenizer_config.json", config.to_string())]);
    assert_eq!(ChatTemplate::from_folder(&path).unwrap().unwrap().render(&with_system(), true).unwrap(), expected);

    // `chat_template.jinja` over the configuration's template.
    let config = json!({"bos_token": "<bos>", "eos_token": "<eos>", "chat_template": "ignored"});
    let (_dir, path) = folder(&[("tokenizer_config.json", config.to_string()), ("chat_template.jinja", gemma.clone())]);
    assert_eq!(ChatTemplate::from_folder(&path).unwrap().unwrap().render(&with_system(), true).unwrap(), expected);

    // No template; a list without a default; a syntax error names the file.
    let (_dir, path) = folder(&[("tokenizer_config.json", json!({"eos_token": "</s>"}).to_string())]);
    assert!(ChatTemplate::from_folder(&path).unwrap().is_none());
    let (_dir, path) = folder(&[]);
    assert!(ChatTemplate::from_folder(&path).unwrap().is_none());
    let config = json!({"chat_template": [{"name": "tool_use", "template": "tools"}]});
    let (_dir, path) = folder(&[("tokenizer_config.json", config.to_string())]);
    let error = ChatTemplate::from_folder(&path).unwrap_err();
    assert!(error.to_string().contains("no template named `default`"), "{error}");
    let (_dir, path) = folder(&[("chat_template.jinja", "line one\n{% if %}".into())]);
    let error = ChatTemplate::from_folder(&path).unwrap_err();
    let text = error.to_string();
    assert!(text.contains("chat_template.jinja` (line 2) does not compile"), "{text}");
}

#[test]
fn runaway_templates_are_stopped() {
    let source = "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}";
    let error = ChatTemplate::new(source, "", "").unwrap().render(&[], false).unwrap_err();
    assert!(matches!(error, Error::Template { failure: "runs too long", .. }), "{error:?}");
    let error = ChatTemplate::new("{{ messages | tojson(indent=100000000) }}", "", "")
        .unwrap()
        .render(&with_system(), false)
        .unwrap_err();
    assert!(error.to_string().contains("indent"), "{error}");
}
