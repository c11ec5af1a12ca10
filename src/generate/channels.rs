//! The channels of gpt-oss's harmony format: a turn is messages, each `<|channel|>NAME
//! <|message|>TEXT<|end|>` (the last ending on `<|return|>` or `<|call|>`), with `<|start|>ROLE`
//! between them. The analysis channel is the model's reasoning, the final channel its answer.
//! The markers are special tokens, which decoded text leaves out: [`Channels`] follows them by
//! id, so that a program can show the answer alone or the reasoning beside it, instead of the
//! channels' names and texts run together.

use super::Tokenizer;

/// The channel of the reasoning.
pub const ANALYSIS: &str = "analysis";

/// Follows the channels of a generated turn, token by token.
#[derive(Clone, Debug)]
pub struct Channels {
    /// The ids of `<|start|>`, `<|channel|>`, `<|message|>` and `<|end|>`, `<|return|>`, `<|call|>`.
    start: u32,
    channel: u32,
    message: u32,
    ends: [Option<u32>; 3],
    state: State,
    /// The name of the channel being read or written.
    name: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Between messages: the role and header before `<|channel|>`.
    Header,
    /// After `<|channel|>`: the channel's name.
    Name,
    /// After `<|message|>`: the message's text.
    Text,
}

/// A piece of a turn's text, with the channel it belongs to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Piece {
    /// The channel (`analysis`, `final`, `commentary`).
    pub channel: String,
    /// The text.
    pub text: String,
}

impl Channels {
    /// The channels of a model whose tokenizer has harmony's markers as single tokens; `None`
    /// for any other model.
    pub fn new(tokenizer: &Tokenizer) -> Option<Channels> {
        let id = |marker: &str| match tokenizer.encode(marker).ok()?.as_slice() {
            [id] => Some(*id),
            _ => None,
        };
        Some(Channels::from_ids(
            id("<|start|>")?,
            id("<|channel|>")?,
            id("<|message|>")?,
            [id("<|end|>"), id("<|return|>"), id("<|call|>")],
        ))
    }

    /// The channels of markers with these ids: `<|start|>`, `<|channel|>`, `<|message|>`, and
    /// the ends of a message (`<|end|>`, `<|return|>`, `<|call|>`).
    pub fn from_ids(start: u32, channel: u32, message: u32, ends: [Option<u32>; 3]) -> Channels {
        Channels { start, channel, message, ends, state: State::Header, name: String::new() }
    }

    /// Takes the next token, `id`, whose decoded text is `text`: the text of a message comes
    /// back with its channel; markers, roles and channel names do not.
    pub fn push(&mut self, id: u32, text: &str) -> Option<Piece> {
        if id == self.channel {
            (self.state, self.name) = (State::Name, String::new());
        } else if id == self.message {
            self.state = State::Text;
        } else if id == self.start || self.ends.contains(&Some(id)) {
            self.state = State::Header;
        } else {
            match self.state {
                State::Header => {}
                State::Name => self.name.push_str(text.trim()),
                State::Text if !text.is_empty() => {
                    return Some(Piece { channel: self.name.clone(), text: text.to_string() });
                }
                State::Text => {}
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_turn_splits_into_its_channels() {
        // <|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final<|message|>Hi!<|return|>
        let (start, channel, message, end, ret) = (1, 2, 3, 4, 5);
        let turn = [
            (channel, ""),
            (10, "analysis"),
            (message, ""),
            (11, "Thi"),
            (12, "nk."),
            (end, ""),
            (start, ""),
            (13, "assistant"),
            (channel, ""),
            (14, "final"),
            (message, ""),
            (15, "Hi"),
            (16, "!"),
            (ret, ""),
        ];
        let mut channels = Channels::from_ids(start, channel, message, [Some(end), Some(ret), None]);
        let pieces: Vec<Piece> = turn.iter().filter_map(|&(id, text)| channels.push(id, text)).collect();
        let text = |name: &str| -> String {
            pieces.iter().filter(|piece| piece.channel == name).map(|piece| piece.text.as_str()).collect()
        };
        assert_eq!((text(ANALYSIS), text("final")), ("Think.".to_string(), "Hi!".to_string()));
        assert_eq!(pieces.len(), 4, "{pieces:?}");
    }
}
