//! Whether a context fits the model's window, once the window is known from the provider's
//! "too long" answer: the window in tokens, and how many characters of the run's messages (as
//! JSON) make a token, both read from the refusal (OpenAI and llama-cpp-python: "maximum
//! context length is N tokens. However, your messages resulted in M tokens"; Anthropic:
//! "prompt is too long: M tokens > N maximum").
//!
//! A model list may also state the window (`openai:a#window=8192`, [`Window::stated`]), known
//! from the run's record before any refusal.
//!
//! Pure integer arithmetic over journaled text, so a replay decides as the run did.
//! Deliberately not here: what a compaction level drops (`compact`), and choosing the level or
//! ending the run (the run machine).

/// A quarter of the window is left for the model's answer.
const ANSWER_SHARE: u64 = 4;

/// Characters a token is taken to be when the refusal does not say how many tokens the refused
/// request had (a cautious figure: JSON and English run nearer four).
const DEFAULT_CHARS_PER_TOKEN: u64 = 3;

/// A model's window, and the characters-per-token ratio measured on a refused request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// The window, in tokens.
    pub tokens: u64,
    /// Characters of the refused request (as JSON).
    pub sample_chars: u64,
    /// Its tokens, as the provider counted them.
    pub sample_tokens: u64,
}

impl Window {
    /// The window a refusal's message names, with the refused request's size (`request_chars`);
    /// `None` when the message names no window.
    pub fn from_refusal(message: &str, request_chars: u64) -> Option<Window> {
        let lower = message.to_lowercase();
        let (window, used) = if let Some(rest) = after(&lower, "maximum context length is ") {
            let window = number(rest)?;
            let used = after(rest, "resulted in ")
                .or_else(|| after(rest, "you requested "))
                .and_then(number);
            (window, used)
        } else if let Some(rest) = after(&lower, "prompt is too long: ") {
            let used = number(rest)?;
            (number(after(rest, "> ")?)?, Some(used))
        } else {
            return None;
        };
        let (sample_chars, sample_tokens) = match used {
            Some(t) if t > 0 && request_chars > 0 => (request_chars, t),
            _ => (DEFAULT_CHARS_PER_TOKEN, 1),
        };
        (window > 0).then_some(Window {
            tokens: window,
            sample_chars,
            sample_tokens,
        })
    }

    /// A window of `tokens` a model list states (`openai:a#window=8192`), at the cautious
    /// characters-per-token figure until a refusal measures one.
    pub fn stated(tokens: u64) -> Window {
        Window {
            tokens,
            sample_chars: DEFAULT_CHARS_PER_TOKEN,
            sample_tokens: 1,
        }
    }

    /// The estimated tokens of a context of `chars` characters.
    pub fn tokens_of(&self, chars: u64) -> u64 {
        let t = u128::from(chars) * u128::from(self.sample_tokens)
            / u128::from(self.sample_chars.max(1));
        u64::try_from(t).unwrap_or(u64::MAX)
    }

    /// A context of `chars` characters fits, with room left for the answer.
    pub fn fits(&self, chars: u64) -> bool {
        self.tokens_of(chars) <= self.tokens - self.tokens / ANSWER_SHARE
    }

    /// A context of `chars` characters cannot fit at all (its estimate alone is past the
    /// window).
    pub fn exceeded_by(&self, chars: u64) -> bool {
        self.tokens_of(chars) > self.tokens
    }
}

fn after<'a>(text: &'a str, needle: &str) -> Option<&'a str> {
    text.find(needle).map(|i| &text[i + needle.len()..])
}

/// The number at the start of `text` (digits, thousands separators skipped).
fn number(text: &str) -> Option<u64> {
    let digits: String = text
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == ',')
        .filter(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_are_read_from_the_providers_refusals() {
        let openai = "This model's maximum context length is 8192 tokens. However, your \
                      messages resulted in 9,120 tokens. Please reduce the length.";
        let w = Window::from_refusal(openai, 18_240).expect("window");
        assert_eq!((w.tokens, w.tokens_of(18_240)), (8192, 9120));
        assert!(w.fits(12_000) && !w.fits(13_000) && !w.exceeded_by(16_000));
        let anthropic = "prompt is too long: 215000 tokens > 200000 maximum";
        let w = Window::from_refusal(anthropic, 430_000).expect("window");
        assert_eq!((w.tokens, w.tokens_of(430_000)), (200_000, 215_000));
        let numberless = "the request exceeds the available context size";
        assert_eq!(Window::from_refusal(numberless, 100), None);
        let stated = crate::llm::ModelSpec::window_of_list("openai:a#window=8192, openai:b, anthropic:c#window=4096");
        assert_eq!(stated, Some(4096), "the smallest the list states");
        assert_eq!(Window::stated(1_000).tokens_of(3_000), 1_000);
        assert_eq!(crate::llm::ModelSpec::window_of_list("openai:a"), None);
        assert!(crate::llm::ModelSpec::parse("openai:a#window=0").is_err());
        assert_eq!(
            crate::llm::ModelSpec::parse("openai:a#window=10").ok(),
            Some(crate::llm::ModelSpec::OpenAi("a".into()))
        );
        let no_count = "This model's maximum context length is 1024 tokens.";
        let w = Window::from_refusal(no_count, 0).expect("window");
        assert_eq!(w.tokens_of(3_000), 1_000, "three characters a token");
    }
}
