"""The output sanity detector: is this answer garbage?

One detector, used on every answer the serving layer receives. It looks for what broken serving produces
and a working model does not: NUL and other control bytes, undecodable bytes (U+FFFD), letters of a script
foreign to the request (CJK, Hebrew, Arabic, Cyrillic, ... that the prompt neither uses nor asks for by
language), leaked special tokens (`<tool_call>`, `<|im_start|>`, `</s>`, ...), runs of punctuation noise, the
tokenizer's own markers left in the text, degenerate repetition, and salad (words of no language, or words in no
grammatical order).

It deliberately does not count words or judge length: the guide records a "fewer than 3 English words"
heuristic that flagged legitimately terse replies ("Got it.", "Test received.") and made a clean run look
broken. A one-word answer is not garbage.

Pure functions only: no requests, no verdicts. Callers decide what a finding means for their check.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections import Counter
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

# Why garbage matters and what to do, for checks that quote findings (the guide's cudagraph section).
WHY = ("a model that answers in token salad is broken for every client, and agents act on it silently; "
       "the guide's Qwen3.8-27B answered 'degenerate multilingual token salad' for one request shape after "
       "two days warm (vLLM #53051: a prefill misrouted into the FULL CUDA graph on a Gated DeltaNet hybrid)")
FIX = ("on a GDN hybrid with MTP (Qwen3.x NVFP4 on GB10) serve with --compilation-config "
       "'{\"cudagraph_mode\": \"PIECEWISE\"}' and replay the stored repro bodies (tests/data/repro, "
       "--repro-dir) after every image bump or flag change; otherwise compare the image, weights and serve "
       "args with the last clean run and read the server log for the request")

# Scripts that never belong in an answer to a prompt written without them. Ranges, not unicodedata
# names, so the result does not depend on the Python build's Unicode version for the common blocks.
# Greek is left out on purpose: English answers use π, α, Σ in maths.
SCRIPTS: dict[str, tuple[tuple[int, int], ...]] = {
    "CJK": (
        (0x2E80, 0x2FDF),    # radicals
        (0x3000, 0x303F),    # CJK symbols and punctuation: 。、「」
        (0x3100, 0x312F),    # bopomofo
        (0x31A0, 0x31FF),
        (0x3200, 0x33FF),    # enclosed CJK, compatibility
        (0x3400, 0x4DBF),    # extension A
        (0x4E00, 0x9FFF),    # unified ideographs
        (0xF900, 0xFAFF),    # compatibility ideographs
        (0xFE30, 0xFE4F),    # compatibility forms
        (0xFF00, 0xFFEF),    # halfwidth and fullwidth forms: ，！？
        (0x20000, 0x3134F),  # extensions B-G
    ),
    "Japanese kana": ((0x3040, 0x309F), (0x30A0, 0x30FF), (0x31F0, 0x31FF)),
    "Hangul": ((0x1100, 0x11FF), (0x3130, 0x318F), (0xA960, 0xA97F), (0xAC00, 0xD7AF), (0xD7B0, 0xD7FF)),
    "Hebrew": ((0x0590, 0x05FF), (0xFB1D, 0xFB4F)),
    "Arabic": ((0x0600, 0x06FF), (0x0750, 0x077F), (0x0870, 0x08FF), (0xFB50, 0xFDFF), (0xFE70, 0xFEFF)),
    "Cyrillic": ((0x0400, 0x052F), (0x1C80, 0x1C8F), (0x2DE0, 0x2DFF), (0xA640, 0xA69F)),
    "Armenian": ((0x0530, 0x058F),),
    "Georgian": ((0x10A0, 0x10FF), (0x2D00, 0x2D2F)),
    "Devanagari and other Indic": ((0x0900, 0x0DFF),),
    "Thai and Lao": ((0x0E00, 0x0EFF),),
    "Tibetan": ((0x0F00, 0x0FFF),),
    "Myanmar": ((0x1000, 0x109F),),
    "Ethiopic": ((0x1200, 0x139F),),
    "Khmer": ((0x1780, 0x17FF),),
    "Mongolian": ((0x1800, 0x18AF),),
    "Syriac and Thaana": ((0x0700, 0x07BF),),
}

# Languages a request may ask for by name ("translate ... into Japanese", "answer in Hebrew"), by the scripts their
# answers are written in. Greek is not listed: its script is never foreign (see SCRIPTS).
ASKED_SCRIPTS: dict[str, tuple[str, ...]] = {
    "CJK": ("chinese", "mandarin", "cantonese", "hanzi", "kanji", "japanese"),
    "Japanese kana": ("japanese", "hiragana", "katakana", "kana"),
    "Hangul": ("korean", "hangul"),
    "Hebrew": ("hebrew", "yiddish"),
    "Arabic": ("arabic", "persian", "farsi", "urdu", "pashto", "uyghur", "kurdish", "sindhi"),
    "Cyrillic": ("russian", "ukrainian", "belarusian", "bulgarian", "serbian", "macedonian", "kazakh", "kyrgyz",
                 "tajik", "mongolian", "cyrillic"),
    "Armenian": ("armenian",),
    "Georgian": ("georgian",),
    "Devanagari and other Indic": ("hindi", "marathi", "nepali", "sanskrit", "devanagari", "bengali", "bangla",
                                   "punjabi", "gurmukhi", "gujarati", "tamil", "telugu", "kannada", "malayalam",
                                   "sinhala", "sinhalese", "odia", "oriya", "assamese"),
    "Thai and Lao": ("thai", "lao"),
    "Tibetan": ("tibetan", "dzongkha"),
    "Myanmar": ("burmese", "myanmar"),
    "Ethiopic": ("amharic", "tigrinya"),
    "Khmer": ("khmer", "cambodian"),
    "Mongolian": ("mongolian",),
    "Syriac and Thaana": ("syriac", "aramaic", "dhivehi", "maldivian", "thaana"),
}
# Languages of the Latin (and Greek) script a request may ask for by name, beyond LEXICON_LANGS: wordfreq's lexicon
# of each, or None where it has none (then whether the answer's words are words cannot be judged: no salad sign).
ASKED_LEXICONS: dict[str, str | None] = {
    "finnish": "fi", "hungarian": "hu", "czech": "cs", "slovak": "sk", "romanian": "ro", "danish": "da",
    "norwegian": "nb", "icelandic": "is", "croatian": "sh", "bosnian": "sh", "serbian": "sh", "slovenian": "sl",
    "slovene": "sl", "latvian": "lv", "lithuanian": "lt", "vietnamese": "vi", "malay": "ms", "filipino": "fil",
    "tagalog": "fil", "catalan": "ca", "greek": "el",
    **dict.fromkeys(("romaji", "pinyin", "transliterate", "transliteration", "romanization", "romanize",
                     "latin", "esperanto", "swahili", "welsh", "irish", "gaelic", "maltese",
                     "basque", "estonian", "albanian", "afrikaans", "galician", "hawaiian", "maori", "yoruba",
                     "zulu", "xhosa", "somali", "hausa", "igbo", "quechua", "uzbek", "azerbaijani", "turkmen",
                     "luxembourgish", "frisian", "breton", "corsican", "klingon")),
}
_ASKED_NAME = re.compile(r"[^\W\d_]+")


def _named(prompt: str) -> set[str]:
    """The lower-case words of the prompt: where language names are looked for."""
    return set(_ASKED_NAME.findall(prompt.lower()))


def scripts_asked(prompt: str) -> set[str]:
    """The foreign-script families the prompt asks for by naming a language ("into Japanese", "in Hebrew")."""
    named = _named(prompt)
    return {script for script, names in ASKED_SCRIPTS.items() if named.intersection(names)}


# Tokens a chat template or tool parser should have consumed; in the answer's text they mean the
# server's parsing or the model's state is broken. Matched literally (case-sensitive).
SPECIAL_TOKENS: tuple[str, ...] = (
    "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<function=", "</function>",
    "</s>", "<unk>", "<pad>", "[INST]", "[/INST]", "[TOOL_CALLS]", "<think>", "</think>",
    "<start_of_turn>", "<end_of_turn>",
)
# Every `<|name|>` token (<|im_start|>, <|endoftext|>, <|eot_id|>, <|start_header_id|>, ...).
_PIPE_TOKEN = re.compile(r"<\|[A-Za-z0-9_.:-]{1,40}\|>")

# Degenerate repetition: one unit repeated back to back. A unit must contain a letter or digit, so
# markdown rules ("-----", "| --- |") and ellipses are not loops.
REPEAT_MIN_COPIES = 4
REPEAT_MIN_SPAN = 48      # characters covered by the loop
REPEAT_MAX_UNIT = 120     # longest unit looked for, in characters
# The same non-trivial line again and again, not necessarily back to back.
LINE_MIN_CHARS = 12
LINE_MAX_COPIES = 4


@dataclass(frozen=True)
class Finding:
    """One sign of garbage: its kind, where it starts (character offset) and a one-line description."""

    kind: str  # nul | control | undecodable | script | special-token | tool-call-leak | reasoning-leak |
    #            bpe-marker | punctuation | repetition | salad | word-salad
    offset: int
    what: str

    def __str__(self) -> str:
        return self.what


def excerpt(text: str, offset: int, width: int = 24) -> str:
    """`text` around `offset`, quoted with escapes, so a finding shows where it is."""
    start, end = max(0, offset - width), min(len(text), offset + width)
    return ("…" if start else "") + repr(text[start:end])[1:-1] + ("…" if end < len(text) else "")


def script_of(ch: str) -> str | None:
    """The foreign-script family of one character, or None for Latin, Greek, digits, symbols."""
    cp = ord(ch)
    if cp < 0x0370:
        return None
    for name, ranges in SCRIPTS.items():
        for lo, hi in ranges:
            if lo <= cp <= hi:
                return name
    return None


def scripts_in(text: str) -> set[str]:
    """The foreign-script families present in `text` (used to allow what the prompt itself contains)."""
    return {s for ch in text if (s := script_of(ch))}


def _control_findings(text: str) -> list[Finding]:
    found: list[Finding] = []
    nul = [i for i, ch in enumerate(text) if ch == "\x00"]
    if nul:
        found.append(Finding("nul", nul[0], f"{len(nul)} NUL byte(s) (\\x00), first at char {nul[0]}: "
                                            f"{excerpt(text, nul[0])}"))
    ctrl = [i for i, ch in enumerate(text)
            if ch not in "\x00\t\n\r" and unicodedata.category(ch) == "Cc"]
    if ctrl:
        found.append(Finding("control", ctrl[0], f"{len(ctrl)} control character(s) "
                                                 f"(first {text[ctrl[0]]!r} at char {ctrl[0]}): "
                                                 f"{excerpt(text, ctrl[0])}"))
    bad = [i for i, ch in enumerate(text) if ch == "\ufffd"]
    if bad:
        found.append(Finding("undecodable", bad[0],
                             f"{len(bad)} undecodable byte sequence(s) (U+FFFD, a token cut mid-character), "
                             f"first at char {bad[0]}: {excerpt(text, bad[0])}"))
    return found


def _script_findings(text: str, allowed: Collection[str]) -> list[Finding]:
    by_script: dict[str, list[int]] = {}
    for i, ch in enumerate(text):
        s = script_of(ch)
        if s and s not in allowed:
            by_script.setdefault(s, []).append(i)
    found = []
    for s, where in by_script.items():
        chars = "".join(dict.fromkeys(text[i] for i in where))[:6]
        found.append(Finding("script", where[0],
                             f"{len(where)} {s} character(s) ({chars!r}) in an answer to a prompt that neither "
                             f"uses them nor asks for a language written in them, first at char {where[0]}: "
                             f"{excerpt(text, where[0])}"))
    return found


def _token_findings(text: str, allow: Collection[str]) -> list[Finding]:
    text = _blank(text, _FENCED, _INLINE)  # a token quoted as code is talked about, not leaked
    hits: dict[str, list[int]] = {}
    for tok in SPECIAL_TOKENS:
        if tok not in allow:
            for m in re.finditer(re.escape(tok), text):
                hits.setdefault(tok, []).append(m.start())
    for m in _PIPE_TOKEN.finditer(text):
        if m.group() not in allow:
            hits.setdefault(m.group(), []).append(m.start())
    return [Finding("special-token", where[0],
                    f"leaked special token {tok} ({len(where)}x), first at char {where[0]}: "
                    f"{excerpt(text, where[0])}")
            for tok, where in sorted(hits.items(), key=lambda kv: kv[1][0])]


# Punctuation noise: a run of punctuation and symbols where an answer has words. What a model whose logits went NaN
# emits under greedy decoding when its token 0 is a punctuation mark ("!" in Llama 3's and Qwen's vocabularies), and
# what GB10s with a broken MoE kernel answered (NVIDIA/cutlass#3227: "!!!!!!!" and Unicode noise). Single spaces and
# line breaks inside the run do not end it ("! ! ! !"); letters, digits and wider gaps do.
NOISE_MIN_RUN = 8  # noise characters in one run, at least half of it: "Yes!!!", "Why?!" and ["", "", ""] are not
_RUN = re.compile(r"[^\w\s](?:\s?[^\w\s])*")
# What rules, tables, leaders, underlines, trees, bars, brackets and quotes are drawn with: a run of only these is
# layout (-----, |:---:|, ......, ~~~~, ├──, ████░░, }]}}), never counted as noise. Emoji are a style and Braille a
# script, not noise.
_LAYOUT = set("-=_*~#+|:.^<>/\\`'\"()[]{}…·•—–") | {chr(c) for c in range(0x2500, 0x25A0)}


def _noise_char(ch: str) -> bool:
    return not (ch.isspace() or ch in _LAYOUT or unicodedata.category(ch) in ("Ps", "Pe", "Pi", "Pf")
                or 0x1F000 <= ord(ch) <= 0x1FAFF or 0x2600 <= ord(ch) <= 0x28FF or ch in "\ufe0f\u200d")


def _noise_findings(text: str, covered: list[tuple[int, int]]) -> list[Finding]:
    """The first run of punctuation noise; every run's span goes into `covered` (not reported again as a loop)."""
    runs = [m for m in _RUN.finditer(_blank(text, _FENCED, _INLINE, _INDENTED))  # code: judged by what it is
            if (noise := sum(map(_noise_char, m.group()))) >= NOISE_MIN_RUN
            and 2 * noise >= len(m.group().replace(" ", "").replace("\n", ""))]  # "", "", "" is an empty row
    covered += [m.span() for m in runs]
    if not runs:
        return []
    m = runs[0]
    noise = [ch for ch in m.group() if _noise_char(ch)]
    return [Finding("punctuation", m.start(),
                    f"punctuation noise: a run of {len(noise)} punctuation or symbol characters "
                    f"({''.join(dict.fromkeys(noise))[:6]!r}) where an answer has words, from char {m.start()} "
                    f"({m.end() - m.start()} chars), what a model with NaN logits or a broken kernel prints: "
                    f"{excerpt(text, m.start())}")]


# The tokenizer's own markers left in the text: byte-level BPE writes a space as Ġ (U+0120) and a newline as Ċ (U+010A),
# SentencePiece a space as ▁ (U+2581); a detokenizer that does not run (a tokenizer without its decoder, a mismatched
# one) prints them, glued to the words or standing alone where it joins tokens with spaces. Judged when systematic: at
# least MARKER_MIN markers, on at least MARKER_MIN_SHARE of the words, so a tokenizer tutorial quoting Ġhello, a
# Maltese name (Ġorġ) or a sparkline (▁▂▃▅▇: ▁ counts only on a word) is not flagged.
MARKERS = "\u0120\u010a\u2581"
MARKER_MIN = 4
MARKER_MIN_SHARE = 0.15
_MARKED = re.compile(r"[\u0120\u010a]|\u2581\w|\w\u2581")
# Code is left out, but only code that is code: a fence over real lines, and inline code in single backticks (the
# markers run fences together: ``` python Ċ def ... ```).
_FENCED_LINES = re.compile(r"```[^\n]*\n.*?(?:```|\Z)", re.DOTALL)
_INLINE_ONLY = re.compile(r"(?<!`)`[^`\n]+`(?!`)")


def _marker_findings(text: str) -> list[Finding]:
    words = _blank(text, _FENCED_LINES, _INLINE_ONLY).split()
    marked = [w for w in words if _MARKED.search(w)]
    markers = sum(ch in MARKERS for w in marked for ch in w)
    if markers < MARKER_MIN or len(marked) < MARKER_MIN_SHARE * len(words):
        return []
    first = min(i for i in (text.find(m) for m in MARKERS) if i >= 0)
    return [Finding("bpe-marker", first,
                    f"tokenizer markers left in the text: {markers} of Ġ (a space), Ċ (a newline) or ▁ (a "
                    f"SentencePiece space) on {len(marked)} of {len(words)} words, from char {first}: the "
                    f"detokenizer did not run or does not match the model: {excerpt(text, first)}")]


def _repetition_findings(text: str, covered: list[tuple[int, int]]) -> list[Finding]:
    found: list[Finding] = []
    for unit_len in range(1, min(REPEAT_MAX_UNIT, len(text) // REPEAT_MIN_COPIES) + 1):
        copies = max(REPEAT_MIN_COPIES - 1, -(-REPEAT_MIN_SPAN // unit_len) - 1)
        pattern = re.compile(rf"(.{{{unit_len}}})\1{{{copies},}}", re.DOTALL)
        for m in pattern.finditer(text):
            unit = m.group(1)
            start, end = m.span()
            if not unit.strip() or not any(ch.isalnum() for ch in unit) and _rule_line(text, start, end):
                continue  # indentation, or a rule (----, ====  ====); "( ( ( ( ( (" among words is a loop
            if any(s <= start < e or s < end <= e for s, e in covered):
                continue  # the same loop, seen with a shorter period
            covered.append((start, end))
            found.append(Finding("repetition", start,
                                 f"degenerate repetition: {unit!r} repeated {len(m.group()) // unit_len}x "
                                 f"back to back from char {start} ({end - start} chars)"))
    lines = [ln.strip() for ln in text.splitlines()]
    counts = Counter(ln for ln in lines if len(ln) >= LINE_MIN_CHARS and any(c.isalpha() for c in ln))
    for line, n in counts.items():
        if n > LINE_MAX_COPIES and not any(line in f.what for f in found):
            found.append(Finding("repetition", text.find(line),
                                 f"degenerate repetition: the line {line[:60]!r} appears {n}x"))
    return found


# The detector's rates (docs/GARBAGE.md) are measured on answers of up to this many tokens: a check that judges one
# answer for garbage gives it this much room (a healthy model says what it has to say in far fewer).
JUDGED_TOKENS = 80


def diagnosed_by(check_id: str, what: str) -> str:
    """What a check's message adds when another check diagnoses the cause: one defect reads as one failure."""
    return f"(the same defect as {check_id}'s, which diagnoses {what}: read its message first)"


# Why a structured answer (JSON, tool-call arguments) cut off at max_tokens fails: said by the checks that see it, so
# that a garbage model reads as one cause.
CUT_SHORT_WHY = ("the answer ran to max_tokens inside its JSON: the model loops or rambles instead of answering "
                 + diagnosed_by("SERVE-SANITY", "garbage answers"))
# Token salad in the Latin script (no foreign script, no NUL, little repetition): prose whose words are mostly not
# words of any language. Judged only on enough prose words; thresholds chosen from docs/GARBAGE.md's matrix.
SALAD_MIN_WORDS = 8
SALAD_UNKNOWN_SHARE = 0.3
SALAD_MIN_ZIPF = 1.0  # wordfreq's Zipf scale: 1.0 is once per 100 million words; 0 is not in the lexicon
LEXICON_LANGS = ("en", "de", "fr", "es", "it", "pt", "nl", "sv", "pl", "tr", "id")
# Salad of real words: words of some language in no grammatical order. Prose in any language holds its most frequent
# words (the, of, and, to, is ... in English: wordfreq's FUNCTION_TOP of each lexicon) at a steady share; clauses of
# content words with almost none of them are no sentences. Judged on clauses (text between line breaks, commas and
# the other punctuation that ends one) of at least CLAUSE_MIN_WORDS words, so that lists, tables, keywords and headline
# bullets are left out, and only on at least WORD_SALAD_MIN_WORDS such words. Thresholds from docs/GARBAGE.md.
FUNCTION_TOP = 100
CLAUSE_MIN_WORDS = 6
WORD_SALAD_MIN_WORDS = 16
WORD_SALAD_MAX_SHARE = 0.1
_LOREM = re.compile(r"\blorem ipsum\b", re.IGNORECASE)  # placeholder text: Latin-like by design, asked for or not
_CLAUSE = re.compile(r"[\n,;:|()\[\]{}\"“”]|[.!?](?=\s)")
_FENCED = re.compile(r"```.*?(?:```|\Z)", re.DOTALL)
_INLINE = re.compile(r"`[^`\n]*`")
_INDENTED = re.compile(r"^(?: {4}|\t).*$", re.MULTILINE)  # Markdown's indented code block
_URLISH = re.compile(r"\b(?:[a-z][a-z0-9+.-]*://|www\.)\S+|\S+@\S+\.\w+", re.IGNORECASE)
_WORD = re.compile(r"[^\W\d_]+(?:['’-][^\W\d_]+)*")
_GLUED = re.compile(r"[^\W\d_A-Z][A-Z]")  # a lower-case letter, then a capital: TodoWrite, programsMad
_CASE_PARTS = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])")  # HelpFormatter -> Help, Formatter


def _blank(text: str, *patterns: re.Pattern[str]) -> str:
    """`text` with what the patterns match replaced by spaces: offsets stay where they were."""
    for pattern in patterns:
        text = pattern.sub(lambda m: " " * len(m.group()), text)
    return text


def _rule_line(text: str, start: int, end: int) -> bool:
    """Whether the lines text[start:end] lies on hold no letter or digit: a rule (----, ====  ====), not prose."""
    line = text[text.rfind("\n", 0, start) + 1:end] + text[end:].partition("\n")[0]
    return not any(ch.isalnum() for ch in line)


def known_word(word: str, langs: tuple[str, ...] = LEXICON_LANGS) -> bool:
    """A word of some language (wordfreq's lexicons of `langs`, by default the common ones), in any case."""
    return _known(word.lower(), langs)


@functools.cache
def _known(word: str, langs: tuple[str, ...]) -> bool:
    from wordfreq import zipf_frequency

    return any(zipf_frequency(word, lang) >= SALAD_MIN_ZIPF for lang in langs)


@functools.cache
def _function_words(lang: str) -> dict[str, None]:
    """A lexicon's FUNCTION_TOP most frequent words, most frequent first (a dict: ordered, and fast to look up)."""
    from wordfreq import top_n_list

    return dict.fromkeys(top_n_list(lang, FUNCTION_TOP))


@functools.lru_cache(maxsize=16)  # one request's content, reasoning and tool calls are judged against one prompt
def lexicons(prompt: str) -> tuple[str, ...] | None:
    """The lexicons an answer's words are judged against: LEXICON_LANGS, and those of the languages the prompt asks
    for by name ("into Finnish"). None when the prompt asks for a language wordfreq has no lexicon of (Latin,
    Swahili), or for one of another script (whose answer may spell it out in Latin letters: romaji, pinyin), or
    is itself written in a language no lexicon holds (a line of it reads as salad, glued identifiers left out: a
    prompt names its tools and classes, TodoWrite, HelpFormatter): then no salad is judged."""
    asked = [ASKED_LEXICONS[name] for name in _named(prompt) if name in ASKED_LEXICONS]
    if None in asked or scripts_asked(prompt):
        return None
    langs = tuple(dict.fromkeys([*LEXICON_LANGS, *sorted(filter(None, asked))]))
    for line in prompt.splitlines():
        words = [w for w in _salad_words(line) if not _GLUED.search(w)]
        unknown = [w for w in words if not known_word(w, langs) and not _name(w)]
        if len(words) >= 3 and len(unknown) >= SALAD_UNKNOWN_SHARE * len(words):
            return None
    return langs


def prose_words(text: str) -> list[str]:
    """The words of the prose in `text`: fenced, indented and inline code, URLs, e-mail addresses, and every token
    with a digit or an identifier's punctuation (paths, versions, snake_case, calls) left out; names stay in."""
    words = []
    for token in _blank(text, _FENCED, _INDENTED, _INLINE, _URLISH).split():
        core = token.strip("\"'“”‘’.,;:!?()[]{}*#>-")
        if core and _WORD.fullmatch(core):
            words.append(core)
    return words


def _name(word: str) -> bool:
    """A capitalised word the lexicons lack, in one piece: a name (Kubernetes, Nguyen). Glued words (programsMad,
    HelpFormatter) are not names: in prose they are identifiers or salad, and salad is made of them."""
    return word[0].isupper() and len(_CASE_PARTS.findall(word)) == 1


def _salad_words(text: str) -> list[str]:
    """The prose words salad is judged on: a word of a foreign script is the script sign's to judge."""
    return [w for w in prose_words(text) if not scripts_in(w)]


def _salad_findings(text: str, prompt: str) -> list[Finding]:
    words = _salad_words(text)
    langs = lexicons(prompt)
    if len(words) < SALAD_MIN_WORDS or langs is None or _LOREM.search(text):
        return []  # a terse answer is never salad ("Got it."), nor one in a language no lexicon holds, nor lorem ipsum
    unknown = [w for w in words if not known_word(w, langs) and not _name(w)]
    if len(unknown) >= SALAD_UNKNOWN_SHARE * len(words):
        first = max(text.find(unknown[0]), 0)
        return [Finding("salad", first,
                        f"token salad: {len(unknown)} of {len(words)} words are words of no language "
                        f"({', '.join(repr(w) for w in unknown[:5])}), from char {first}: {excerpt(text, first)}")]
    clauses = [c for c in map(_salad_words, _CLAUSE.split(_blank(text, _FENCED, _INDENTED, _INLINE, _URLISH)))
               if len(c) >= CLAUSE_MIN_WORDS]
    judged = [w.lower() for c in clauses for w in c]
    if len(judged) < WORD_SALAD_MIN_WORDS:
        return []  # lists, tables, keywords and headline bullets: no clause long enough to need grammar
    lang = max(langs, key=lambda lang: sum(w in _function_words(lang) for w in judged))
    share = sum(w in _function_words(lang) for w in judged) / len(judged)
    if share >= WORD_SALAD_MAX_SHARE:
        return []
    first = max(text.find(clauses[0][0]), 0)
    return [Finding("word-salad", first,
                    f"word salad: words in no grammatical order, only {share:.0%} of {len(judged)} words in clauses "
                    f"are the short words every sentence holds (the {FUNCTION_TOP} most frequent of any lexicon: "
                    f"{', '.join(list(_function_words(lang))[:4])}, ...), from char {first}: "
                    f"{excerpt(text, first)}")]


def scan(text: str, prompt: str = "", allow_tokens: Collection[str] = ()) -> list[Finding]:
    """Every sign of garbage in `text`, in order of position. Scripts that occur in `prompt`, or that a language it
    names is written in, are allowed (a question in Chinese may be answered in Chinese, "translate into Hebrew" in
    Hebrew), and languages it names lend their lexicons to salad; `allow_tokens` lists special tokens the caller
    expects in the text. An empty list means clean: terse answers ("Paris", "391", "Got it.") are."""
    allowed = scripts_in(prompt) | scripts_asked(prompt)
    covered: list[tuple[int, int]] = []
    findings = (_control_findings(text) + _script_findings(text, allowed) + _token_findings(text, allow_tokens)
                + _marker_findings(text) + _noise_findings(text, covered) + _repetition_findings(text, covered))
    if not findings:  # salad is judged on what is otherwise clean: one finding per defect
        findings = _salad_findings(text, prompt)
    return sorted(findings, key=lambda f: f.offset)


def prompt_text(body: Mapping[str, Any]) -> str:
    """What the people behind a chat request wrote (system and user turns), to know which scripts an answer
    may use. Tool definitions and tool results are left out: a file an agent read may hold any script, and
    allowing it would blind the detector in exactly the agent replays that reproduce garbage."""
    parts: list[str] = []

    def walk(value: Any) -> None:
        if isinstance(value, str):
            parts.append(value)
        elif isinstance(value, Mapping):
            for v in value.values():
                walk(v)
        elif isinstance(value, list | tuple):
            for v in value:
                walk(v)

    for message in body.get("messages") or []:
        if isinstance(message, Mapping) and message.get("role") in ("system", "developer", "user"):
            walk(message.get("content"))
    walk(body.get("prompt", ""))
    return "\n".join(parts)


REASONING_FIELDS = ("reasoning", "reasoning_content")  # this vLLM's name, then older builds


THINK_TAGS = ("<think>", "</think>")


REASONING_FIX = ("serve with --reasoning-parser matching the model (qwen3 for Qwen3.x): without it the thinking "
                 "reaches the answer; this vLLM build returns the thinking as `reasoning` (older builds: "
                 "`reasoning_content`), clients must read that field")


def thinking_in_content(content: str) -> str:
    """The thinking a message's content carries in <think> tags, or before a lone </think> (a server that did not
    split it off); "" where there is none. A tag quoted as code is talked about, not thinking."""
    prose = _blank(content, _FENCED, _INLINE)
    opened = re.search(r"<think>(.*?)(?:</think>|$)", prose, re.S)
    if opened and opened.group(1).strip():
        return opened.group(1).strip()
    closed = re.search(r"^(.*?)</think>", prose, re.S)
    return closed.group(1).strip() if closed else ""


def reasoning_of(message: Mapping[str, Any]) -> tuple[str | None, str]:
    """Which field carries a message's thinking, and the thinking ("" and None when there is none)."""
    for key in REASONING_FIELDS:
        if message.get(key):
            return key, message[key]
    return None, ""


TOOL_CALL_TAGS = ("leaked special token <tool_call>", "leaked special token </tool_call>")


def scan_message(message: Mapping[str, Any], prompt: str = "") -> list[Finding]:
    """Findings for one chat answer (a `message` or an assembled stream): its content and reasoning, and
    the guide's fingerprint, a literal <tool_call> in content while tool_calls stays empty."""
    content = message.get("content") or ""
    _, reasoning = reasoning_of(message)
    findings = scan(content, prompt)
    prose = _blank(content, _FENCED, _INLINE)  # a `<tool_call>` quoted as code is talked about, not leaked
    if "<tool_call>" in prose and not message.get("tool_calls"):
        at = prose.index("<tool_call>")
        # Reported once, as the fingerprint, not again as plain leaked tokens (its closing tag included).
        findings = [f for f in findings if not (f.kind == "special-token" and f.what.startswith(TOOL_CALL_TAGS))]
        findings.insert(0, Finding(
            "tool-call-leak", at,
            f"the guide's garbage fingerprint: a literal <tool_call> in content (char {at}) while tool_calls[] "
            f"is empty: {excerpt(content, at)}"))
    tags = sorted((prose.find(t), t) for t in THINK_TAGS if t in prose and t not in prompt)  # asked about: allowed
    if not reasoning and tags:
        at, tag = tags[0]
        # One finding: the thinking block, not two leaked tokens (no reasoning parser split it off).
        findings = [f for f in findings
                    if not (f.kind == "special-token" and f.what.split(" (")[0].endswith(THINK_TAGS))]
        findings.insert(0, Finding(
            "reasoning-leak", at,
            f"thinking in the content (a literal {tag} at char {at}) while no reasoning field carries any: "
            f"{excerpt(content, at)}"))
    for f in scan(reasoning, prompt):
        findings.append(Finding(f.kind, f.offset, f"in the reasoning field: {f.what}"))
    for call in message.get("tool_calls") or []:
        fn = call.get("function") or {}
        for f in scan(f"{fn.get('name') or ''} {fn.get('arguments') or ''}", prompt):
            findings.append(Finding(f.kind, f.offset, f"in tool call {fn.get('name')!r}: {f.what}"))
    return findings


def summary(findings: Iterable[Finding], limit: int = 4) -> str:
    """The findings as one quotable string: the first `limit`, then how many more."""
    items = list(findings)
    text = "; ".join(f.what for f in items[:limit])
    return text + (f"; and {len(items) - limit} more" if len(items) > limit else "")
