//! `nnx run MODEL`: generates text with a model ([`nnx::models::load`]), streaming it to
//! stdout as the tokens come; with `--prompt` once, without it a terminal chat read from stdin;
//! with `--json` one object of ids, text and speeds.

use std::io::{BufRead, IsTerminal, Write};

use nnx::Device;
use nnx::generate::{GenerationConfig, Generator, Message, Sampling, TextStream, Timings};
use nnx::models::{CausalLm, LoadOptions, LoadedModel};

use crate::common::CliError;

/// Where the model computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum DeviceChoice {
    /// The CPU kernels.
    Cpu,
    /// The first GPU adapter (`NNX_GPU` picks another by its index).
    Gpu,
}

/// The arguments of `nnx run`. The short forms and names are llama.cpp's (`-m`, `-p`, `-n`,
/// `--temp`, `-c`, `-t`, `-s`, `--repeat-penalty`) and mlx-lm's (`--max-tokens`, `--min-p`),
/// so that commands people already type work.
#[derive(clap::Args)]
#[command(group(clap::ArgGroup::new("model_source").args(["model", "model_flag"]).required(true)))]
pub struct Args {
    /// A GGUF file, a transformers or mlx-community folder, or an `hf://` path to either.
    #[arg(value_name = "MODEL")]
    model: Option<String>,
    /// The model, as llama.cpp's `-m` gives it (instead of the positional MODEL).
    #[arg(short = 'm', long = "model", value_name = "MODEL", conflicts_with = "model")]
    model_flag: Option<String>,
    /// The user's message: sent through the model's chat template when it has one (with
    /// `--raw`, continued as plain text). Without it (and without `--file`), each line read
    /// from stdin is a turn of a chat, keeping the conversation, until the end of the input.
    #[arg(short = 'p', long)]
    prompt: Option<String>,
    /// Read the prompt from this file (as `--prompt` takes it).
    #[arg(short = 'f', long = "file", value_name = "FILE", conflicts_with = "prompt")]
    prompt_file: Option<std::path::PathBuf>,
    /// Skip the chat template: the prompt is continued as plain text.
    #[arg(long, conflicts_with = "chat")]
    raw: bool,
    /// Refuse a model without a chat template instead of continuing the prompt as plain text
    /// (the template is used by default when the model has one).
    #[arg(long)]
    chat: bool,
    /// A system message placed before the user's through the chat template.
    #[arg(long, value_name = "TEXT", alias = "system-prompt", conflicts_with = "raw")]
    system: Option<String>,
    /// For a model that writes its reasoning in a channel of its own (gpt-oss): `show` prints
    /// it before the answer, between `<think>` and `</think>`; `hide` prints the answer alone.
    /// `--json` gives it as `reasoning` either way.
    #[arg(long, value_enum, default_value_t = Reasoning::Show)]
    reasoning: Reasoning,
    /// The most tokens to generate per turn; -1 (any negative number) generates until the
    /// context is full or the model ends its turn.
    #[arg(
        short = 'n',
        long = "max-new-tokens",
        visible_aliases = ["n-predict", "max-tokens"],
        default_value_t = 128,
        allow_negative_numbers = true
    )]
    max_new_tokens: i64,
    /// Sampling temperature; 0 or below is greedy. Default: the model's
    /// `generation_config.json` (greedy when it has none, or when it does not sample).
    #[arg(long, visible_alias = "temp", allow_negative_numbers = true)]
    temperature: Option<f32>,
    /// Draw only among the K most likely tokens (0 or below: no limit). Given without
    /// `--temperature` to a model that does not sample, it samples at temperature 1.
    #[arg(long, value_name = "K", allow_negative_numbers = true)]
    top_k: Option<i64>,
    /// Draw only among the most likely tokens whose probability reaches P, in (0, 1] (1: no
    /// limit). Given without `--temperature` to a model that does not sample, it samples at
    /// temperature 1.
    #[arg(long, value_name = "P")]
    top_p: Option<f32>,
    /// Draw only among the tokens at least P times as likely as the most likely one, in
    /// [0, 1] (0: no limit), as llama.cpp's min-p. Given without `--temperature` to a model
    /// that does not sample, it samples at temperature 1.
    #[arg(long, value_name = "P")]
    min_p: Option<f32>,
    /// Divides the positive logits (multiplies the negative ones) of every token already in
    /// the sequence; 1 is none. Default: the model's `generation_config.json`. nnx penalizes
    /// the whole sequence, as transformers does, not llama.cpp's last 64 tokens.
    #[arg(long, visible_alias = "repetition-penalty", value_name = "X")]
    repeat_penalty: Option<f32>,
    /// Also stop when the text contains this string (repeat it for several).
    #[arg(long, value_name = "TEXT")]
    stop: Vec<String>,
    /// The seed of the draws: the same seed, model and prompt give the same text.
    #[arg(short = 's', long, default_value_t = 0)]
    seed: u64,
    /// The context in tokens, prompt and generated text together (0: the model's own; at most
    /// the model's).
    #[arg(short = 'c', long = "ctx-size", value_name = "N")]
    ctx_size: Option<usize>,
    /// The CPU threads that compute (default: one per core).
    #[arg(short = 't', long, value_name = "N")]
    pub threads: Option<usize>,
    /// Where the model computes.
    #[arg(long, value_enum, default_value_t = DeviceChoice::Cpu)]
    pub device: DeviceChoice,
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

impl Args {
    /// The model, positional or `-m`.
    fn model(&self) -> &str {
        self.model.as_deref().or(self.model_flag.as_deref()).unwrap_or_default()
    }
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
        DeviceChoice::Cpu => {
            let options = LoadOptions { device: nnx::Host, adapters: adapters(&args)? };
            generate(&nnx::models::load_with(args.model(), &options)?, &args)
        }
        DeviceChoice::Gpu => run_on_gpu(&args),
    }
}

/// Loads the model onto adapter `NNX_GPU` (0 by default) and generates there. The adapter is
/// named on stderr, with a warning when it is a CPU or software one (Mesa's lavapipe, say):
/// those run far slower than `--device cpu`.
#[cfg(feature = "gpu")]
fn run_on_gpu(args: &Args) -> Result<String, CliError> {
    let index = std::env::var("NNX_GPU").ok().and_then(|index| index.parse().ok()).unwrap_or(0);
    let gpu = nnx::Gpu::open(index)
        .map_err(|error| CliError(format!("`--device gpu`: {error}; run on the CPU with `--device cpu`")))?;
    eprintln!("nnx: running on GPU adapter {}", gpu.description());
    if gpu.is_software() {
        eprintln!(
            "nnx: warning: adapter {index} computes on the CPU (a software driver): expect it to be much slower \
             than `--device cpu`; pick another adapter with `NNX_GPU=INDEX`, or run with `--device cpu`"
        );
    }
    let options = LoadOptions { device: gpu, adapters: adapters(args)? };
    generate(&nnx::models::load_with(args.model(), &options)?, args)
}

/// Without the `gpu` feature: the error that says so.
#[cfg(not(feature = "gpu"))]
fn run_on_gpu(_: &Args) -> Result<String, CliError> {
    Err(CliError(
        "`--device gpu`: this nnx was built without the `gpu` feature; install it with \
         `cargo install --path nnx-cli --features gpu`, or run with `--device cpu`"
            .into(),
    ))
}

/// Whether the prompt goes through the model's chat template: when it has one, unless `--raw`.
fn templated<D: Device>(loaded: &LoadedModel<D>, args: &Args) -> bool {
    loaded.chat_template.is_some() && !args.raw
}

/// The settings of one turn: the model's end-of-sequence ids and sampling defaults, with the
/// flags over them. `max_new_tokens` is set per turn ([`budget`]).
fn settings<D: Device>(loaded: &LoadedModel<D>, args: &Args) -> Result<GenerationConfig, CliError> {
    // llama.cpp's conventions: 0 or below is no limit for top-k, 1 for top-p, 0 for min-p.
    let top_k = args.top_k.map(|k| usize::try_from(k).unwrap_or(0)).filter(|&k| k > 0);
    let top_p = args.top_p.filter(|&p| p != 1.0);
    let min_p = args.min_p.filter(|&p| p != 0.0);
    let limited = args.top_k.is_some() || args.top_p.is_some() || args.min_p.is_some();
    let sampling = match (args.temperature, loaded.generation.sampling) {
        // A temperature of 0 or below is greedy, as in llama.cpp (NaN is refused by `check`).
        (Some(temperature), _) if temperature <= 0.0 => Sampling::Greedy,
        (Some(temperature), _) => Sampling::Random { temperature, top_k, top_p, min_p },
        (None, Sampling::Random { temperature, top_k: file_k, top_p: file_p, min_p: file_min }) => {
            let top_k = if args.top_k.is_some() { top_k } else { file_k };
            let top_p = if args.top_p.is_some() { top_p } else { file_p };
            let min_p = if args.min_p.is_some() { min_p } else { file_min };
            Sampling::Random { temperature, top_k, top_p, min_p }
        }
        (None, Sampling::Greedy) if limited => Sampling::Random { temperature: 1.0, top_k, top_p, min_p },
        (None, Sampling::Greedy) => Sampling::Greedy,
    };
    let mut config = GenerationConfig { sampling, seed: args.seed, ..loaded.generation.clone() };
    if let Some(penalty) = args.repeat_penalty {
        config.repetition_penalty = penalty;
    }
    if let Some(template) = &loaded.chat_template
        && templated(loaded, args)
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
    for stop in &args.stop {
        if stop.is_empty() {
            return Err(CliError("`--stop`: the stop string is empty: give the text that ends the turn".into()));
        }
        config.stop_strings.push(stop.clone());
    }
    config.check()?;
    Ok(config)
}

/// The context of the run in tokens: `--ctx-size` (0 or absent: the model's), at most the
/// model's own, with a note when the flag asked for more.
fn context<D: Device>(loaded: &LoadedModel<D>, args: &Args) -> usize {
    let own = loaded.model.context_length();
    match args.ctx_size.filter(|&size| size > 0) {
        Some(size) if size > own => {
            eprintln!("nnx: `--ctx-size {size}` is past the model's context of {own} tokens: using {own}");
            own
        }
        Some(size) => size,
        None => own,
    }
}

/// The tokens a turn may generate after `prompt` tokens: `--max-new-tokens` (negative: no
/// limit), within what the context leaves.
fn budget(args: &Args, context: usize, prompt: usize) -> usize {
    let left = context.saturating_sub(prompt);
    usize::try_from(args.max_new_tokens).map_or(left, |wanted| wanted.min(left))
}

/// The prompt of `--prompt` or `--file`, if any. The file is read whole: a prompt longer than
/// any context is refused before it is tokenized.
fn prompt_text(args: &Args) -> Result<Option<String>, CliError> {
    /// Far more text than any model's context holds.
    const MAX_PROMPT_FILE: u64 = 64 << 20;
    let Some(path) = &args.prompt_file else { return Ok(args.prompt.clone()) };
    let io = |source| nnx::Error::Io { action: "read", path: path.clone(), source };
    let size = std::fs::metadata(path).map_err(io)?.len();
    if size > MAX_PROMPT_FILE {
        return Err(CliError(format!(
            "`--file {}` is {size} bytes, more than the {MAX_PROMPT_FILE} bytes nnx reads as a prompt: give a \
             shorter prompt",
            path.display()
        )));
    }
    let text = std::fs::read_to_string(path).map_err(io)?;
    Ok(Some(text))
}

/// The opening messages of a chat: `--system`'s, if any.
fn opening(args: &Args) -> Vec<Message> {
    args.system.iter().map(|system| Message::new("system", system.as_str())).collect()
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

/// Whether a model's reasoning channel is printed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Reasoning {
    /// Before the answer, between `<think>` and `</think>`.
    Show,
    /// Not at all.
    Hide,
}

/// What one turn produced.
struct Turn {
    generated: Vec<u32>,
    text: String,
    /// The reasoning channel's text, for a model of channels.
    reasoning: Option<String>,
    timings: Timings,
}

/// What a turn prints of a model of channels (gpt-oss): each message's text, the reasoning
/// between `<think>` and `</think>` (or not at all), never the markers' names.
struct Printed {
    channels: nnx::generate::Channels,
    reasoning: Reasoning,
    /// The channel of the last text printed.
    last: Option<String>,
    answer: String,
    thought: String,
}

impl Printed {
    /// The text to print for token `id` of decoded text `text`.
    fn push(&mut self, id: u32, text: &str) -> String {
        let Some(piece) = self.channels.push(id, text) else { return String::new() };
        let thinking = piece.channel == nnx::generate::ANALYSIS;
        if thinking { &mut self.thought } else { &mut self.answer }.push_str(&piece.text);
        if thinking && self.reasoning == Reasoning::Hide {
            return String::new();
        }
        let mut out = String::new();
        if self.last.as_deref() != Some(piece.channel.as_str()) {
            let was_thinking = self.last.as_deref() == Some(nnx::generate::ANALYSIS);
            if was_thinking {
                out.push_str("\n</think>\n\n");
            }
            if thinking {
                out.push_str("<think>\n");
            }
            self.last = Some(piece.channel.clone());
        }
        out.push_str(&piece.text);
        out
    }

    /// What is left to print when the turn ends.
    fn finish(&self) -> &'static str {
        if self.last.as_deref() == Some(nnx::generate::ANALYSIS) { "\n</think>" } else { "" }
    }
}

/// Generates after `prompt`, writing the text to stdout as it comes unless `quiet`; a model of
/// channels prints its channels' texts as `reasoning` says.
fn turn<D: Device>(
    loaded: &LoadedModel<D>,
    prompt: &[u32],
    config: GenerationConfig,
    quiet: bool,
    reasoning: Reasoning,
) -> Result<Turn, CliError> {
    let mut printed = match &loaded.chat_template {
        Some(template) if template.has_channels() => nnx::generate::Channels::new(&loaded.tokenizer)
            .map(|channels| Printed { channels, reasoning, last: None, answer: String::new(), thought: String::new() }),
        _ => None,
    };
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
        if let Some(Some(token)) = chosen.first() {
            let text = stream.push(*token)?;
            let text = match printed.as_mut() {
                Some(printed) => printed.push(*token, &text),
                None => text,
            };
            if !quiet {
                write_text(&mut out, &text)?;
            }
        }
    }
    if !quiet {
        let rest = stream.finish()?;
        match &printed {
            Some(printed) => write_text(&mut out, printed.finish())?,
            None => write_text(&mut out, &rest)?,
        }
        writeln!(out)?;
        out.flush()?;
    }
    let generated = generator.generated(0).to_vec();
    if let Some(printed) = printed {
        return Ok(Turn {
            generated,
            text: printed.answer,
            reasoning: Some(printed.thought),
            timings: generator.timings(),
        });
    }
    let mut text = loaded.tokenizer.decode(&generated)?;
    // The text ends before the stop string the turn ended on.
    if let Some(at) = stop_strings.iter().filter_map(|stop| text.find(stop.as_str())).min() {
        text.truncate(at);
    }
    Ok(Turn { generated, text, reasoning: None, timings: generator.timings() })
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

/// The speeds line printed after each turn, on stderr. A turn that ended with the token the
/// prompt's pass chose had no decoding step to time: it shows no decoding speed.
fn report(prompt: usize, turn: &Turn) {
    let decode = match turn.timings.decode_tokens {
        0 => String::new(),
        _ => format!(", {:.1} tok/s", turn.timings.decode_tokens_per_second()),
    };
    eprintln!(
        "prompt: {prompt} tokens, {:.1} tok/s; generated: {} tokens{decode}",
        turn.timings.prefill_tokens_per_second(),
        turn.generated.len(),
    );
}

/// The `--json` object of a turn.
fn json_report(prompt_ids: &[u32], turn: &Turn) -> String {
    let value = serde_json::json!({
        "prompt_ids": prompt_ids,
        "generated_ids": turn.generated,
        "text": turn.text,
        "reasoning": turn.reasoning,
        "prefill_tokens_per_s": turn.timings.prefill_tokens_per_second(),
        "decode_tokens_per_s": turn.timings.decode_tokens_per_second(),
    });
    serde_json::to_string(&value).expect("the report serializes")
}

/// Generates after `--prompt` or `--file` (through the chat template unless `--raw` or the
/// model has none), or chats over stdin.
fn generate<D: Device>(loaded: &LoadedModel<D>, args: &Args) -> Result<String, CliError> {
    if loaded.chat_template.is_none() {
        let flag = if args.chat { Some("--chat") } else { args.system.as_ref().map(|_| "--system") };
        if let Some(flag) = flag {
            return Err(CliError(format!(
                "`{flag}`: `{}` has no chat template; run without `{flag}` to continue the prompt as plain text",
                args.model()
            )));
        }
    }
    let config = settings(loaded, args)?;
    let context = context(loaded, args);
    let Some(prompt) = prompt_text(args)? else { return chat_loop(loaded, args, config, context) };
    let prompt_ids = match &loaded.chat_template {
        Some(template) if templated(loaded, args) => {
            let mut messages = opening(args);
            messages.push(Message::new("user", prompt.as_str()));
            chat_ids(loaded, &template.render(&messages, true)?)?
        }
        _ => loaded.tokenizer.encode(&prompt)?,
    };
    if prompt_ids.is_empty() {
        return Err(CliError("the prompt has no tokens: give a prompt of some text".into()));
    }
    if prompt_ids.len() > context {
        return Err(CliError(format!(
            "the prompt is {} tokens, longer than the context of {context} tokens of `{}`: give a shorter prompt",
            prompt_ids.len(),
            args.model()
        )));
    }
    let config = GenerationConfig { max_new_tokens: budget(args, context, prompt_ids.len()), ..config };
    let turn = turn(loaded, &prompt_ids, config, args.json, args.reasoning)?;
    if !args.json {
        report(prompt_ids.len(), &turn);
        return Ok(String::new());
    }
    Ok(json_report(&prompt_ids, &turn) + "\n")
}

/// A chat read from stdin, a line per turn, until its end: through the chat template when the
/// model has one and `--raw` is not given (the whole conversation rendered each turn), else
/// each line continued alone. With `--json`, one object per turn.
fn chat_loop<D: Device>(
    loaded: &LoadedModel<D>,
    args: &Args,
    config: GenerationConfig,
    context: usize,
) -> Result<String, CliError> {
    let stdin = std::io::stdin();
    let interactive = stdin.is_terminal() && !args.json;
    let mut messages = opening(args);
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
            Some(template) if templated(loaded, args) => {
                messages.push(Message::new("user", line));
                chat_ids(loaded, &template.render(&messages, true)?)?
            }
            _ => loaded.tokenizer.encode(&line)?,
        };
        if prompt_ids.len() >= context {
            return Err(CliError(format!(
                "the conversation is {} tokens, past the context of {context} tokens: start a new one",
                prompt_ids.len(),
            )));
        }
        let config = GenerationConfig { max_new_tokens: budget(args, context, prompt_ids.len()), ..config.clone() };
        let turn = turn(loaded, &prompt_ids, config, args.json, args.reasoning)?;
        if args.json {
            println!("{}", json_report(&prompt_ids, &turn));
        } else {
            report(prompt_ids.len(), &turn);
        }
        if templated(loaded, args) {
            messages.push(Message::new("assistant", turn.text.trim()));
        }
    }
    if interactive {
        eprintln!();
    }
    Ok(String::new())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// gpt-oss's turn `<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final
    /// <|message|>Hi!<|return|>` as token ids (markers 1-5) and their decoded texts.
    const TURN: [(u32, &str); 12] = [
        (2, ""),
        (10, "analysis"),
        (3, ""),
        (11, "Think."),
        (4, ""),
        (1, ""),
        (12, "assistant"),
        (2, ""),
        (13, "final"),
        (3, ""),
        (14, "Hi!"),
        (5, ""),
    ];

    fn print(reasoning: Reasoning) -> (String, Printed) {
        let channels = nnx::generate::Channels::from_ids(1, 2, 3, [Some(4), Some(5), None]);
        let mut printed = Printed { channels, reasoning, last: None, answer: String::new(), thought: String::new() };
        let mut out: String = TURN.iter().map(|&(id, text)| printed.push(id, text)).collect();
        out.push_str(printed.finish());
        (out, printed)
    }

    #[test]
    fn a_turn_of_channels_prints_the_reasoning_as_asked_and_never_the_markers_names() {
        let (shown, printed) = print(Reasoning::Show);
        assert_eq!(shown, "<think>\nThink.\n</think>\n\nHi!");
        assert_eq!((printed.answer.as_str(), printed.thought.as_str()), ("Hi!", "Think."));
        let (hidden, printed) = print(Reasoning::Hide);
        assert_eq!(hidden, "Hi!");
        assert_eq!(printed.thought, "Think.", "kept for `--json`");
    }
}
