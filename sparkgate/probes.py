"""What the serving layer sends: request bodies, tools, images and the agent-like repro body.

Pure builders, no requests and no verdicts: the checks in tests/serving decide what an answer means.
"""

from __future__ import annotations

import base64
import io
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# ---- chat ------------------------------------------------------------------------------------------------


THINKING_OFF = {"enable_thinking": False}


def chat_body(model: str, content: str | list[dict[str, Any]], max_tokens: int = 48, temperature: float = 0,
              **extra: Any) -> dict[str, Any]:
    """The one chat body every check and every measurement sends: one user turn (text, or content parts such as
    an image), greedy by default so the same question gets the same answer and a failure reproduces. Thinking is
    off (a reasoning model would spend a short budget thinking and answer nothing); templates without the switch
    ignore it. `extra` adds or overrides fields (tools, response_format, chat_template_kwargs...)."""
    return {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
            "temperature": temperature, "chat_template_kwargs": THINKING_OFF, **extra}


def said(answer: str, text: str) -> bool:
    """`answer` appears in `text` as a whole word (so "red" is not found in "hundred")."""
    return re.search(rf"(?<![\w.]){re.escape(answer)}(?![\w]|\.\d)", text, re.IGNORECASE) is not None


# Asked so, even the embedded default (135M) opens with "Hello" ("Say hello in one short sentence." it does not).
GREET = "Greet me with the word hello."
# What a model asked to greet says, in the languages the suite's prompts might get an answer in.
GREETINGS = ("hello", "hi", "hey", "greetings", "welcome", "howdy", "good morning", "good day", "hallo", "bonjour",
             "hola")


GREETING_WITHIN_WORDS = 8  # "Hello!", "Sure! Hello there.": a model that says hello says it first


def greets(text: str) -> bool:
    """A greeting among the first words of `text` (one deep inside token salad is chance, not an answer)."""
    opening = " ".join(text.split()[:GREETING_WITHIN_WORDS])
    return any(said(g, opening) for g in GREETINGS)


@dataclass(frozen=True)
class Probe:
    """A question with one known short answer: a working model of any size gets it right."""

    prompt: str
    answer: str  # must appear as a whole word in the reply

    def answered(self, text: str) -> bool:
        return said(self.answer, text)


# Chosen so that even the embedded default (135M parameters) answers them: it gets "17*23" wrong (381),
# which says nothing about the serving stack, so arithmetic stays at the level every model gets right.
COHERENCE = (
    Probe("What is the capital of France? Answer with one word.", "Paris"),
    Probe("What is 2 + 3? Answer with the number only.", "5"),
    Probe("How many days are in a week? Answer with a number.", "7"),
)

# Ordinary English prompts of several shapes for the sanity check: terse, prose, a list, code.
SANITY_PROMPTS = (
    "Reply with exactly: Got it.",
    "Say hello in one short sentence.",
    "Describe a sunny day at the beach in two sentences.",
    "List three fruits, one per line.",
    "Write a Python function that adds two numbers.",
)

# ---- tools -----------------------------------------------------------------------------------------------

WEATHER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"city": {"type": "string", "description": "city name, e.g. Paris"},
                   "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    "required": ["city"],
    "additionalProperties": False,
}
TIME_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"timezone": {"type": "string", "description": "IANA name, e.g. Europe/Paris"}},
    "required": ["timezone"],
    "additionalProperties": False,
}


def tool(name: str, description: str, schema: dict[str, Any], strict: bool = False) -> dict[str, Any]:
    """An OpenAI function tool. `strict` asks the server to hold the arguments to the schema, as
    OpenAI's API does; vLLM honours it per tool (without it a tool_choice=required call may carry
    arguments of any JSON shape)."""
    fn: dict[str, Any] = {"name": name, "description": description, "parameters": schema}
    if strict:
        fn["strict"] = True
    return {"type": "function", "function": fn}


def weather_tool(strict: bool = False) -> dict[str, Any]:
    return tool("get_weather", "Get the current weather for a city", WEATHER_SCHEMA, strict)


def time_tool(strict: bool = False) -> dict[str, Any]:
    return tool("get_time", "Get the current local time in a timezone", TIME_SCHEMA, strict)


def hermes_call(name: str, arguments: dict[str, Any]) -> str:
    """A tool call as a Hermes-format template writes it into the assistant's text."""
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def assistant_call(name: str, arguments: dict[str, Any], call_id: str, parser: str | None) -> dict[str, Any]:
    """An assistant turn that called a tool, as a conversation carries it back to the model. A chat template that
    does not render `tool_calls` (SmolLM2's) would show the model an empty turn: for the Hermes parser the call is
    written into the text exactly as a Hermes template renders it; every other parser gets OpenAI's form, which its
    template renders natively."""
    if parser == "hermes":
        return {"role": "assistant", "content": hermes_call(name, arguments)}
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}]}


def tool_turn(result: dict[str, Any], call_id: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": json.dumps(result)}


def tool_history(parser: str | None) -> list[dict[str, Any]]:
    """Two earlier turns in which the assistant called each tool, as an agent's conversation carries."""
    calls = [("What is the weather in Berlin?", "get_weather", {"city": "Berlin"},
              {"city": "Berlin", "temperature_c": 12, "sky": "cloudy"}, "It is 12 °C and cloudy in Berlin."),
             ("What time is it in London?", "get_time", {"timezone": "Europe/London"},
              {"timezone": "Europe/London", "time": "14:05"}, "It is 14:05 in London.")]
    turns: list[dict[str, Any]] = []
    for i, (question, name, args, result, answer) in enumerate(calls):
        call_id = f"call_history_{i}"
        turns += [{"role": "user", "content": question}, assistant_call(name, args, call_id, parser),
                  tool_turn(result, call_id), {"role": "assistant", "content": answer}]
    return turns


# ---- structured output -----------------------------------------------------------------------------------

CITY_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 40},
                   "country": {"type": "string", "maxLength": 40},
                   "is_capital": {"type": "boolean"}},
    "required": ["city", "country", "is_capital"],
    "additionalProperties": False,
}
# Answers no model gives to "What is 2 + 3?" unless the server holds it to the constraint.
UNNATURAL_CHOICES = ("zebra-seven", "quokka-three")

# ---- images ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Picture:
    """An image the suite draws itself, with what it shows and how to ask about it."""

    png: bytes
    question: str
    answers: tuple[str, ...]  # any of them, as a whole word, is a correct description

    def answered(self, text: str) -> bool:
        return any(said(a, text) for a in self.answers)

    @property
    def data_url(self) -> str:
        return "data:image/png;base64," + base64.b64encode(self.png).decode()


def picture(kind: str = "digits") -> Picture:
    """`digits`: a large black 47 on white; `shape`: a red disc on white. Drawn with Pillow so the
    content is known without a data set, and large enough for any vision tower's resolution."""
    from PIL import Image, ImageDraw, ImageFont

    img = Image.new("RGB", (448, 448), "white")
    draw = ImageDraw.Draw(img)
    if kind == "digits":
        font = ImageFont.load_default(size=260)
        draw.text((224, 224), "47", fill="black", font=font, anchor="mm")
        question, answers = "What number is written in this image? Answer with the number only.", ("47",)
    elif kind == "shape":
        draw.ellipse((74, 74, 374, 374), fill=(220, 20, 20))
        question, answers = "What colour is the shape in this image? Answer with one word.", ("red",)
    else:
        raise ValueError(f"unknown picture {kind!r} (digits, shape)")
    buf = io.BytesIO()
    img.save(buf, "PNG")
    return Picture(buf.getvalue(), question, answers)


def image_content(text: str, url: str) -> list[dict[str, Any]]:
    """A question about an image, as a user turn's content parts."""
    return [{"type": "text", "text": text}, {"type": "image_url", "image_url": {"url": url}}]


# ---- bad input -------------------------------------------------------------------------------------------


def too_long_text(max_model_len: int) -> str:
    """A prompt longer than the context: " word" is one token in every BPE vocabulary in use."""
    return "Repeat after me:" + " word" * (max_model_len + 256)


# ---- the agent-like repro body ---------------------------------------------------------------------------

_TOOL_NAMES = (
    "bash", "batch", "browser_back", "browser_click", "browser_navigate", "browser_screenshot", "code_search",
    "diagnostics", "edit", "fetch", "find_references", "git_diff", "git_log", "git_status", "glob", "grep",
    "list", "lsp_hover", "multi_edit", "notebook_edit", "patch", "read", "rename_symbol", "run_tests",
    "task", "todo_read", "todo_write", "web_search", "webfetch", "write",
)
_SYSTEM_HEAD = (
    "You are an autonomous coding agent working in a user's repository. You read files before you change "
    "them, you make the smallest change that solves the task, and you run the tests after every change. "
    "Use the tools provided; call exactly one tool at a time and wait for its result. Never invent file "
    "contents. When the task is done, answer the user in plain English with a short summary.\n\n"
)
_GUIDELINES = (
    "Guideline {n}: when you edit {area}, keep the existing style, keep imports sorted, and explain in one "
    "line why the change is needed. Prefer reading the surrounding code over guessing; if a command fails, "
    "read its output before trying again, and do not repeat a failing command unchanged.\n"
)
_AREAS = ("the parser", "the HTTP handlers", "the database layer", "the build scripts", "the tests",
          "the CLI", "the configuration loader", "the documentation", "the scheduler", "the cache")


def _agent_tool(name: str) -> dict[str, Any]:
    props: dict[str, Any] = {"path": {"type": "string", "description": f"the file or folder {name} works on"}}
    if name in ("write", "edit", "multi_edit", "patch", "notebook_edit"):
        props["content"] = {"type": "string", "description": "the new text"}
    if name in ("bash", "run_tests", "task"):
        props = {"command": {"type": "string", "description": "what to run"},
                 "timeout_s": {"type": "integer", "minimum": 1}}
    return tool(name, f"The {name.replace('_', ' ')} tool: use it to {name.replace('_', ' ')} in the "
                      f"workspace. Returns its result as text.", {
                          "type": "object", "properties": props, "required": sorted(props)[:1]})


def agent_body(model: str, padding_chars: int, max_tokens: int = 64, n_tools: int = 30) -> dict[str, Any]:
    """An agent-like request: a system prompt padded with `padding_chars` of guidelines and `n_tools` tools
    sorted by name, so `write` is last, as agent clients sort them. The guide's garbage came from a real
    payload of this shape (30 tools, `write` last, ~33K tokens)."""
    # Every other name sorts before "write", so sorted by name it is last, as in the guide's payload.
    names = sorted(set(_TOOL_NAMES) - {"write"})[:n_tools - 1] + ["write"]
    tools = [_agent_tool(n) for n in names]
    # Plain English, no error text to echo: SmolLM2 at greedy loops on a quoted "KeyError:" (a model's loop,
    # not a serving defect, and this body is meant to find serving defects).
    user = ("The tests of the configuration loader fail. Find the cause and fix it. Start by saying in one "
            "sentence what you will do first.")
    lines: list[str] = []
    while sum(map(len, lines)) < padding_chars:
        lines.append(_GUIDELINES.format(n=len(lines) + 1, area=_AREAS[len(lines) % len(_AREAS)]))
    return {"model": model, "max_tokens": max_tokens, "temperature": 0, "tools": tools, "tool_choice": "auto",
            "messages": [{"role": "system", "content": _SYSTEM_HEAD + "".join(lines)},
                         {"role": "user", "content": user}]}


def sized_agent_body(model: str, target_tokens: int, count: Callable[[dict[str, Any]], int | None] | None = None,
                     max_tokens: int = 64) -> dict[str, Any]:
    """`agent_body` padded to about `target_tokens` prompt tokens. `count(body)` returns the prompt tokens
    of a body as the server's tokenizer and chat template see it (tools count only where the template
    renders them), or None; without it English runs ~4 characters per token."""
    bare = agent_body(model, 0, max_tokens)
    base = count(bare) if count else None
    if base is None:
        base = len(json.dumps(bare["messages"]) + json.dumps(bare["tools"])) // 4
        return agent_body(model, max(0, target_tokens - base) * 4, max_tokens)
    probe_chars = max(0, target_tokens - base) * 4
    padded = count(agent_body(model, probe_chars, max_tokens)) if probe_chars else None
    # The padding's own characters per token, measured: the guidelines are one repeated English shape.
    ratio = probe_chars / (padded - base) if padded and padded > base else 4.0
    return agent_body(model, int(max(0, target_tokens - base) * ratio), max_tokens)
