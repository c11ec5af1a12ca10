//! `nnx run MODEL`: generates text with a model ([`nnx::models::load`]), streaming it to
//! stdout as the tokens come; with `--prompt` once, without it a terminal chat read from stdin;
//! with `--json` one object of ids, text and speeds.

use std::io::{BufRead, IsTerminal, Write};

use nnx::Device;
use nnx::generate::{GenerationConfig, Generator, Message, Sampling, TextStream, Timings};
use nnx::models::{CausalLm, LoadedModel};

use crate::common::CliError;

/// Where the model computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum DeviceChoice {
    /// The CPU kernels.
    Cpu,
    /// The first GPU adapter (`NNX_GPU` picks another by its index).
    Gpu,
}

/// The arguments of `nnx run`.
#[derive(clap::Args)]
pub struct Args {
    /// A GGUF file, a transformers or mlx-community folder, or an `hf://` path to either.
    model: String,
    /// The text to continue (or, with `--chat`, the user's message). Without it, each line
    /// read from stdin is a turn of a chat (through the model's chat template when it has one,
    /// keeping the conversation; each line continued on its own when it has none), until the
    /// end of the input.
    #[arg(long)]
    prompt: Option<String>,
    /// The most tokens to generate per turn.
    #[arg(long, default_value_t = 128)]
    max_new_tokens: usize,
    /// Sampling temperature; 0 is greedy. Default: the model's `generation_config.json`
    /// (greedy when it has none, or when it does not sample).
    #[arg(long)]
    temperature: Option<f32>,
    /// Draw only among the K most likely tokens. Given without `--temperature` to a model that
    /// does not sample, it samples at temperature 1.
    #[arg(long, value_name = "K")]
    top_k: Option<usize>,
    /// Draw only among the most likely tokens whose probability reaches P, in (0, 1]. Given
    /// without `--temperature` to a model that does not sample, it samples at temperature 1.
    #[arg(long, value_name = "P")]
    top_p: Option<f32>,
    /// The seed of the draws: the same seed, model and prompt give the same text.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Where the model computes.
    #[arg(long, value_enum, default_value_t = DeviceChoice::Cpu)]
    device: DeviceChoice,
    /// Send the prompt as one user message through the model's chat template, and stop at its
    /// end-of-turn markers too.
    #[arg(long)]
    chat: bool,
    /// Print nothing while generating, then one JSON object (a line per turn of a chat):
    /// `prompt_ids`, `generated_ids`, `text` (the generated text only), `prefill_tokens_per_s`
    /// and `decode_tokens_per_s`.
    #[arg(long)]
    json: bool,
    /// A LoRA adapter (PEFT or MLX-LM folder, GGUF LoRA file, `hf://` path) merged into the model's float
    /// weights before it runs, with an optional multiplier of its scale (`adapter/:0.5`);
    /// repeat it for several, merged in turn.
    #[arg(long, value_name = "ADAPTER[:SCALE]")]
    lora: Vec<String>,
}

/// The adapters of `--lora`, each with its multiplier (1 unless `:SCALE` ends the argument).
fn adapters(args: &Args) -> Result<Vec<(nnx::adapter::Adapter, f32)>, CliError> {
    args.lora
        .iter()
        .map(|spec| {
            let (path, scale) = match spec.rsplit_once(':') {
                Some((path, scale)) if scale.parse::<f32>().is_ok() => (path, scale.parse::<f32>().unwrap_or(1.0)),
                _ => (spec.as_str(), 1.0),
            };
            if !scale.is_finite() {
                return Err(CliError(format!("`--lora {spec}`: the scale must be a finite number")));
            }
            Ok((nnx::adapter::Adapter::open_source(path)?, scale))
        })
        .collect()
}

/// Loads the model on the chosen device and generates.
pub fn run(args: Args) -> Result<String, CliError> {
    match args.device {
        DeviceChoice::Cpu if args.lora.is_empty() => generate(&nnx::models::load(&args.model)?, &args),
        DeviceChoice::Cpu => generate(&nnx::models::load_with_adapters(&args.model, &adapters(&args)?)?, &args),
        DeviceChoice::Gpu => run_on_gpu(&args),
    }
}

/// Loads the model onto adapter `NNX_GPU` (0 by default) and generates there.
#[cfg(feature = "gpu")]
fn run_on_gpu(args: &Args) -> Result<String, CliError> {
    let index = std::env::var("NNX_GPU").ok().and_then(|index| index.parse().ok()).unwrap_or(0);
    let gpu = nnx::Gpu::open(index)
        .map_err(|error| CliError(format!("`--device gpu`: {error}; run on the CPU with `--device cpu`")))?;
    if args.lora.is_empty() {
        return generate(&nnx::models::load_on(&args.model, &gpu)?, args);
    }
    generate(&nnx::models::load_on_with_adapters(&args.model, &gpu, &adapters(args)?)?, args)
}

/// Without the `gpu` feature: the error that says so.
#[cfg(not(feature = "gpu"))]
fn run_on_gpu(_: &Args) -> Result<String, CliError> {
    Err(CliError(
        "`--device gpu`: this nnx was built without the `gpu` feature; rebuild nnx-cli with it, or run with `--device cpu`"
            .into(),
    ))
}

/// The settings of one turn: the model's end-of-sequence ids and sampling defaults, with the
/// flags over them.
fn settings<D: Device>(loaded: &LoadedModel<D>, args: &Args) -> Result<GenerationConfig, CliError> {
    let sampling = match (args.temperature, loaded.generation.sampling) {
        (Some(0.0), _) => Sampling::Greedy,
        (Some(temperature), _) => Sampling::Random { temperature, top_k: args.top_k, top_p: args.top_p },
        (None, Sampling::Random { temperature, top_k, top_p }) => {
            Sampling::Random { temperature, top_k: args.top_k.or(top_k), top_p: args.top_p.or(top_p) }
        }
        (None, Sampling::Greedy) if args.top_k.is_some() || args.top_p.is_some() => {
            Sampling::Random { temperature: 1.0, top_k: args.top_k, top_p: args.top_p }
        }
        (None, Sampling::Greedy) => Sampling::Greedy,
    };
    let mut config = GenerationConfig {
        max_new_tokens: args.max_new_tokens,
        sampling,
        seed: args.seed,
        ..loaded.generation.clone()
    };
    if let Some(template) = &loaded.chat_template
        && (args.chat || args.prompt.is_none())
    {
        config.stop_strings = template.stop_strings();
        // A marker that is one token of the vocabulary (`<|eot_id|>`) ends the turn as that
        // token, as llama.cpp's end-of-generation tokens do: decoded text leaves special
        // tokens out, so the string alone would never be seen.
        for stop in &config.stop_strings {
            let mut ids = loaded.tokenizer.encode(stop)?;
            if loaded.bos_token_id.is_some() && ids.first() == loaded.bos_token_id.as_ref() {
                ids.remove(0);
            }
            if let [id] = ids[..]
                && !config.eos_token_ids.contains(&id)
            {
                config.eos_token_ids.push(id);
            }
        }
    }
    config.check()?;
    Ok(config)
}

/// The ids of a rendered chat template, as llama.cpp takes them
/// (`common_chat_template_direct_apply`, then `common_tokenize` with `add_special` and
/// `parse_special`): a template that writes the BOS itself has it dropped from the text when
/// the tokenizer adds one, so the prompt starts with one BOS and not two. Here the tokenizer
/// adds its BOS and reads the template's as the special token it is, and the first of the two
/// goes; the text after it tokenizes alike either way, as llama.cpp reads the text after a
/// special token as it reads the start of the text.
fn chat_ids<D: Device>(loaded: &LoadedModel<D>, rendered: &str) -> Result<Vec<u32>, CliError> {
    let mut ids = loaded.tokenizer.encode(rendered)?;
    if let Some(bos) = loaded.bos_token_id
        && ids.len() >= 2
        && ids[0] == bos
        && ids[1] == bos
    {
        ids.remove(0);
    }
    Ok(ids)
}

/// What one turn produced.
struct Turn {
    generated: Vec<u32>,
    text: String,
    timings: Timings,
}

/// Generates after `prompt`, writing the text to stdout as it comes unless `quiet`.
fn turn<D: Device>(
    loaded: &LoadedModel<D>,
    prompt: &[u32],
    config: GenerationConfig,
    quiet: bool,
) -> Result<Turn, CliError> {
    let stop_strings = config.stop_strings.clone();
    let max_new_tokens = config.max_new_tokens;
    let mut generator = Generator::new(&loaded.model, &[prompt], config).map_err(|error| match error {
        nnx::Error::Allocation { bytes, .. } => CliError(format!(
            "the key/value cache for a prompt of {} tokens and up to {max_new_tokens} new ones takes {bytes} bytes, \
             more than the system gives: ask for fewer tokens with `--max-new-tokens`",
            prompt.len()
        )),
        nnx::Error::TooLarge { .. } => CliError(format!(
            "the key/value cache for a prompt of {} tokens and up to {max_new_tokens} new ones is too large to \
             address: ask for fewer tokens with `--max-new-tokens`",
            prompt.len()
        )),
        other => other.into(),
    })?;
    if !stop_strings.is_empty() {
        generator = generator.with_tokenizer(&loaded.tokenizer);
    }
    let mut stream = TextStream::new(&loaded.tokenizer, prompt);
    let mut out = std::io::stdout().lock();
    while let Some(chosen) = generator.step()? {
        if let Some(Some(token)) = chosen.first()
            && !quiet
        {
            write_text(&mut out, &stream.push(*token)?)?;
        }
    }
    if !quiet {
        write_text(&mut out, &stream.finish()?)?;
        writeln!(out)?;
        out.flush()?;
    }
    let generated = generator.generated(0).to_vec();
    let mut text = loaded.tokenizer.decode(&generated)?;
    // The text ends before the stop string the turn ended on.
    if let Some(at) = stop_strings.iter().filter_map(|stop| text.find(stop.as_str())).min() {
        text.truncate(at);
    }
    Ok(Turn { generated, text, timings: generator.timings() })
}

/// Writes generated text with control characters escaped (but its line breaks kept), as the
/// commands print text that came from files.
fn write_text(out: &mut impl Write, text: &str) -> std::io::Result<()> {
    if text.is_empty() {
        return Ok(());
    }
    let escaped: Vec<_> = text.split('\n').map(nnx::text::printable).collect();
    out.write_all(escaped.join("\n").as_bytes())?;
    out.flush()
}

/// The speeds line printed after each turn, on stderr.
fn report(prompt: usize, turn: &Turn) {
    eprintln!(
        "prompt: {prompt} tokens, {:.1} tok/s; generated: {} tokens, {:.1} tok/s",
        turn.timings.prefill_tokens_per_second(),
        turn.generated.len(),
        turn.timings.decode_tokens_per_second(),
    );
}

/// The `--json` object of a turn.
fn json_report(prompt_ids: &[u32], turn: &Turn) -> String {
    let value = serde_json::json!({
        "prompt_ids": prompt_ids,
        "generated_ids": turn.generated,
        "text": turn.text,
        "prefill_tokens_per_s": turn.timings.prefill_tokens_per_second(),
        "decode_tokens_per_s": turn.timings.decode_tokens_per_second(),
    });
    serde_json::to_string(&value).expect("the report serializes")
}

/// Generates after `--prompt` (through the template with `--chat`), or chats over stdin.
fn generate<D: Device>(loaded: &LoadedModel<D>, args: &Args) -> Result<String, CliError> {
    if args.chat && loaded.chat_template.is_none() {
        return Err(CliError(format!(
            "`--chat`: `{}` has no chat template; run without `--chat` to continue the prompt as plain text",
            args.model
        )));
    }
    let config = settings(loaded, args)?;
    let Some(prompt) = &args.prompt else { return chat_loop(loaded, args, config) };
    let prompt_ids = match (&loaded.chat_template, args.chat) {
        (Some(template), true) => chat_ids(loaded, &template.render(&[Message::new("user", prompt.as_str())], true)?)?,
        _ => loaded.tokenizer.encode(prompt)?,
    };
    if prompt_ids.is_empty() {
        return Err(CliError("the prompt has no tokens: give a prompt of some text".into()));
    }
    let context = loaded.model.context_length();
    if prompt_ids.len() > context {
        return Err(CliError(format!(
            "the prompt is {} tokens, longer than the context of {context} tokens of `{}`: give a shorter prompt",
            prompt_ids.len(),
            args.model
        )));
    }
    let turn = turn(loaded, &prompt_ids, config, args.json)?;
    if !args.json {
        report(prompt_ids.len(), &turn);
        return Ok(String::new());
    }
    Ok(json_report(&prompt_ids, &turn) + "\n")
}

/// A chat read from stdin, a line per turn, until its end: through the chat template when the
/// model has one (the whole conversation rendered each turn), else each line continued alone.
/// With `--json`, one object per turn.
fn chat_loop<D: Device>(loaded: &LoadedModel<D>, args: &Args, config: GenerationConfig) -> Result<String, CliError> {
    let stdin = std::io::stdin();
    let interactive = stdin.is_terminal() && !args.json;
    let mut messages = Vec::new();
    let mut lines = stdin.lock().lines();
    loop {
        if interactive {
            eprint!("> ");
        }
        let Some(line) = lines.next().transpose()? else { break };
        if line.trim().is_empty() {
            continue;
        }
        let prompt_ids = match &loaded.chat_template {
            Some(template) => {
                messages.push(Message::new("user", line));
                chat_ids(loaded, &template.render(&messages, true)?)?
            }
            None => loaded.tokenizer.encode(&line)?,
        };
        if prompt_ids.len() >= loaded.model.context_length() {
            return Err(CliError(format!(
                "the conversation is {} tokens, past the model's context of {}: start a new one",
                prompt_ids.len(),
                loaded.model.context_length()
            )));
        }
        let turn = turn(loaded, &prompt_ids, config.clone(), args.json)?;
        if args.json {
            println!("{}", json_report(&prompt_ids, &turn));
        } else {
            report(prompt_ids.len(), &turn);
        }
        if loaded.chat_template.is_some() {
            messages.push(Message::new("assistant", turn.text.trim()));
        }
    }
    if interactive {
        eprintln!();
    }
    Ok(String::new())
}
