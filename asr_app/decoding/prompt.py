"""Whisper's decoder prompt: [<|startofprev|> previous text] <|startoftranscript|> [lang] [task] [<|notimestamps|>]."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


def eos_token(generation_config) -> int:
    """<|endoftext|>: the generation config names it as an int or a list."""
    eos = generation_config.eos_token_id
    return eos if isinstance(eos, int) else eos[0]


@dataclass(frozen=True)
class Prompt:
    tokens: tuple[int, ...]
    sot_index: int  # position of <|startoftranscript|>; its logits give no_speech_prob
    detect_language: bool = False  # multilingual, no language given: the token after SOT is a placeholder

    def with_language(self, token: int) -> Prompt:
        """This prompt with `token` as its language (the token right after <|startoftranscript|>)."""
        tokens = list(self.tokens)
        tokens[self.sot_index + 1] = token
        return Prompt(tuple(tokens), self.sot_index, False)


def build_prompt(generation_config, tokenizer, *, language: str | None, task: str, timestamps: bool,
                 previous_text: str | Sequence[int] | None, max_target_positions: int) -> Prompt:
    """`previous_text`: text to condition on, or the token ids of earlier windows as they were decoded
    (timestamps included, as openai/whisper passes them: a prompt without timestamps talks the model into
    leaving them out, and long-form then loses the rest of a window)."""
    gc = generation_config
    sot = [gc.decoder_start_token_id]
    detect = False
    if getattr(gc, "is_multilingual", False):
        lang_to_id = gc.lang_to_id
        detect = language is None  # the engine detects it from the audio and replaces the placeholder
        key = "<|en|>" if detect else (language if language.startswith("<|") else f"<|{language}|>")
        if key not in lang_to_id:
            raise ValueError(f"unknown language '{language}' for this model")
        sot += [lang_to_id[key], gc.task_to_id[task]]
    else:
        if language not in (None, "en", "english"):
            raise ValueError(f"this is an English-only model; language '{language}' is not available")
        if task != "transcribe":
            raise ValueError("this is an English-only model; it cannot translate")
    if not timestamps:
        sot.append(gc.no_timestamps_token_id)
    prev: list[int] = []
    ids: list[int] = []
    if isinstance(previous_text, str):
        if previous_text.strip():
            ids = tokenizer(" " + previous_text.strip(), add_special_tokens=False)["input_ids"]
    elif previous_text:
        ids = [int(t) for t in previous_text]
    if ids:
        # openai/whisper keeps at most the last n_ctx // 2 - 1 prompt tokens
        prev = [gc.prev_sot_token_id, *ids[-(max_target_positions // 2 - 1):]]
    return Prompt(tokens=tuple(prev + sot), sot_index=len(prev), detect_language=detect)
