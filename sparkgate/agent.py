"""An agent loop as a probe family: the model must call a tool, read its result, call the next and answer, as an agent
harness drives it, many turns on one conversation.

The task: the temperature in the capital of a country. `get_capital` answers the capital, `get_temperature` a
temperature no model can know (a number made from the city's name) and only for a capital, so only an answer that went
through both calls, or knew the capital and called the second, carries it. The harness repairs what it can, as real
ones do: a call to an unknown tool, or with arguments that are not a JSON object with the required field, gets an error
as its result and the loop goes on. A call left as text in the content (no tool_calls[]) is a leaked call: the agent
never sees it, and the episode ends there.

Per episode, two outcomes the gate pairs with the baseline's (sparkgate.quality.flips):
- completed: the answer carries the task's temperature, within MAX_TURNS requests;
- calls clean: the model called at least one tool, and every call reached tool_calls[] well-formed.

Pure code: the requests go through `send` (tests/serving/test_agent.py asks and judges).
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .probes import assistant_call, said, tool, tool_turn
from .quality import CAPITALS, SEED, digest

MAX_TURNS = 5  # requests per episode: two calls, the answer, and room for two repaired calls
MAX_TOKENS = 96
COUNTRY = {"type": "object", "properties": {"country": {"type": "string"}}, "required": ["country"]}
CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS = [tool("get_capital", "Get the capital city of a country", COUNTRY, False),
         tool("get_temperature", "Get the current temperature in a city, in degrees Celsius", CITY, False)]
REQUIRED = {"get_capital": "country", "get_temperature": "city"}
# Small models do not call a tool unprompted when the chat template does not render the tools (SmolLM2's): the
# system prompt says what they are, as harnesses that inject tool descriptions do.
SYSTEM = ("You are an agent with two tools. To call one, write <tool_call>{\"name\": NAME, \"arguments\": {...}}"
          "</tool_call> and stop. get_capital(country) returns a country's capital city. get_temperature(city) "
          "returns a city's temperature. Call get_capital first, then get_temperature with the city it returned, then "
          "answer with the temperature.")
EXAMPLE = ("Germany", "Berlin")  # the worked example in the conversation's history; never a task
CAPITAL_OF = {country.casefold(): city for country, city in CAPITALS}  # what get_capital knows
CITIES = {city.casefold() for _, city in CAPITALS}  # the cities get_temperature knows
_LEAK = re.compile(r"<tool_call>|\"name\"\s*:\s*\"(?:get_capital|get_temperature)\"")


@dataclass(frozen=True)
class Task:
    id: str  # stable: agent-N; the gate pairs episodes by it
    country: str
    city: str

    @property
    def question(self) -> str:
        return f"What is the temperature in the capital of {self.country}?"

    @property
    def temperature(self) -> int:
        return temperature(self.city)


def temperature(city: str) -> int:
    """A city's temperature as get_temperature answers it: from its name, 11 to 33 °C, never the example's 9."""
    return 11 + sum(map(ord, city)) % 23


def tasks(n: int | None = None) -> list[Task]:
    """The first `n` tasks (all of them: None) of one seeded order: the same on every machine and version."""
    countries = [c for c in CAPITALS if c != EXAMPLE]
    random.Random(f"{SEED}-agent").shuffle(countries)
    out = [Task(f"agent-{i}", country, city) for i, (country, city) in enumerate(countries)]
    return out[:n] if n else out


def history(parser: str | None) -> list[dict[str, Any]]:
    """The system prompt and one worked episode, as an agent's conversation carries its earlier turns."""
    country, city = EXAMPLE
    return [{"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"What is the temperature in the capital of {country}?"},
            assistant_call("get_capital", {"country": country}, "call_example_0", parser),
            tool_turn({"country": country, "capital": city}, "call_example_0"),
            assistant_call("get_temperature", {"city": city}, "call_example_1", parser),
            tool_turn({"city": city, "temperature_c": 9}, "call_example_1"),
            {"role": "assistant", "content": f"It is 9 °C in {city}, the capital of {country}."}]


@dataclass
class Episode:
    task: Task
    calls: list[str] = field(default_factory=list)  # each call as the model made it, for the message
    malformed: list[str] = field(default_factory=list)  # what was wrong with each malformed call
    leaked: str = ""  # the content that carried a call the server did not parse
    answer: str = ""
    turns: int = 0
    cut: bool = False  # a turn ran to max_tokens (inside a call: a model that loops)
    out_of_turns: bool = False  # still calling after MAX_TURNS requests

    @property
    def completed(self) -> bool:
        return said(str(self.task.temperature), self.answer)

    @property
    def calls_clean(self) -> bool:
        return bool(self.calls) and not self.malformed and not self.leaked

    def describe(self) -> str:
        """How it ended first (a report's cell shows the first few words), then the calls it made."""
        if self.leaked:
            ended = f"leaked call {self.leaked[:80]!r}"
        else:
            ended = f"no answer in {self.turns} turns" if self.out_of_turns else f"answered {self.answer[:80]!r}"
        calls = ", ".join(self.calls) or "none"
        bad = f"; malformed: {'; '.join(self.malformed)}" if self.malformed else ""
        return f"{self.task.country} ({self.task.temperature} °C): {ended}; calls: {calls}{bad}"


def _result(name: str, args: dict[str, Any], raw: Any) -> tuple[dict[str, Any], str]:
    """What the tool answers to the call's arguments (`args`, as _loads read them from `raw`), and what was wrong with
    the call ("" if nothing): the harness's repair is the error."""
    if name not in REQUIRED:
        return {"error": f"unknown tool {name!r}: the tools are get_capital and get_temperature"}, \
            f"unknown tool {name!r}"
    need = REQUIRED[name]
    if not isinstance(args.get(need), str):
        return {"error": f"{name} takes a JSON object with a string {need!r}"}, \
            f"{name} arguments {str(raw)[:60]!r} lack a string {need!r}"
    value = args[need].strip()
    if name == "get_capital":
        return {"country": value, "capital": CAPITAL_OF.get(value.casefold(), "unknown")}, ""
    if value.casefold() not in CITIES:  # a well-formed call the task went wrong in: not malformed, not completed
        return {"error": f"no temperature known for {value!r}: get_temperature takes a capital city"}, ""
    return {"city": value, "temperature_c": temperature(value)}, ""


def setup_digest(task: Task) -> str:
    """What an episode's outcome depends on besides the server: the system prompt, the worked example, the tools, the
    question, the answer the tools lead to and the limits. A baseline's episode pairs only with one run the same way."""
    return digest(json.dumps([SYSTEM, history(None), TOOLS, task.question, task.city, task.temperature, MAX_TURNS,
                              MAX_TOKENS]))


def run(task: Task, send: Callable[[list[dict[str, Any]]], Mapping[str, Any]], parser: str | None) -> Episode:
    """One episode: `send(messages)` returns the answer's first choice (a server's, untrusted: its message and
    finish_reason)."""
    messages = [*history(parser), {"role": "user", "content": task.question}]
    episode = Episode(task)
    while episode.turns < MAX_TURNS:
        episode.turns += 1
        choice = send(messages)
        message = choice.get("message") if isinstance(choice.get("message"), Mapping) else {}
        episode.cut |= choice.get("finish_reason") == "length"
        content = message.get("content") if isinstance(message.get("content"), str) else ""
        calls = [c for c in message.get("tool_calls") or [] if isinstance(c, Mapping)] \
            if isinstance(message.get("tool_calls"), list) else []
        if not calls:
            if _LEAK.search(content):
                episode.leaked = content
            else:
                episode.answer = content
            return episode
        for i, call in enumerate(calls):
            fn = call.get("function") if isinstance(call.get("function"), Mapping) else {}
            name, raw = str(fn.get("name")), fn.get("arguments")
            episode.calls.append(f"{name[:40]!r}({repr(raw)[:60]})")  # a server's strings: escaped
            args = _loads(raw)
            result, problem = _result(name, args, raw)
            if problem:
                episode.malformed.append(problem)
            call_id = str(call.get("id") or f"call_{episode.turns}_{i}")
            messages += [assistant_call(name, args, call_id, parser), tool_turn(result, call_id)]
    episode.out_of_turns = True
    return episode


def _loads(raw: Any) -> dict[str, Any]:
    """A call's arguments as an object: a JSON string read, an object as it came, anything else kept as text."""
    try:
        value = json.loads(raw) if isinstance(raw, str) else raw
    except ValueError:
        value = None
    return value if isinstance(value, dict) else {"raw": str(raw)[:200]}
