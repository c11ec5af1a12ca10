//! A chat template of arbitrary bytes (read as UTF-8, invalid sequences replaced), compiled and
//! rendered over a short conversation with and without the generation prompt: it may be
//! refused, but must never panic, overflow the stack, hang or allocate without bound.

#![no_main]

use libfuzzer_sys::fuzz_target;
use nnx::generate::{ChatTemplate, Message};

fuzz_target!(|data: &[u8]| {
    let source = String::from_utf8_lossy(data);
    let template = match ChatTemplate::new(&source, "<s>", "</s>") {
        Ok(template) => template,
        Err(error) => {
            let _ = error.to_string();
            return;
        }
    };
    let messages = [
        Message::new("system", "You are helpful."),
        Message::new("user", "Hello!"),
        Message::new("assistant", "Hi, how can I help?"),
        Message::new("user", "Tell me a joke."),
    ];
    for add_generation_prompt in [false, true] {
        match template.render(&messages, add_generation_prompt) {
            Ok(prompt) => assert!(prompt.len() <= 4 << 20, "a prompt of {} bytes passed the bound", prompt.len()),
            Err(error) => {
                let _ = error.to_string();
            }
        }
    }
    let _ = template.stop_strings();
});
