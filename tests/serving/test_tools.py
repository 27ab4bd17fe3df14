"""Tool calls arrive as tool_calls[] with arguments that parse and validate, never as text in the content.

The guide's failure fingerprint is a literal `<tool_call>` in the content while tool_calls[] stays empty: where a
check asks for a call, that is its own failure (no tool call, the content quoted, the parser named in the fix). Every
answer still goes through the sanity detector, and other garbage points at SERVE-SANITY.
"""

import json

import jsonschema
import pytest

from sparkgate import sanity
from sparkgate.probes import TIME_SCHEMA, WEATHER_SCHEMA, chat_body, time_tool, tool_history, weather_tool

SCHEMAS = {"get_weather": WEATHER_SCHEMA, "get_time": TIME_SCHEMA}
# A call left as text in the content is these checks' own finding (no tool call, the content quoted), not garbage.
OWN = ("tool-call-leak",)
TOOLS_FIX = ("serve with --enable-auto-tool-choice and the --tool-call-parser that matches the model's format "
             "(qwen3_coder or qwen3_xml for Qwen3, hermes for Hermes-style templates); a `<tool_call>` left in "
             "the content means the parser did not recognise the model's output")


@pytest.fixture
def tools_declared(check, recipe):
    if not recipe.features.tools:
        check.cannot_run(f"recipe {recipe.name} does not declare tool calling (features.tools: false)",
                         "serve with --enable-auto-tool-choice --tool-call-parser NAME and set "
                         "features.tools: true in the recipe")


def call_problems(calls, expect_name=None, expect_value=None):
    """What is wrong with a list of tool calls: unknown tool, arguments that are not a JSON object, or that
    do not validate against the tool's schema, or (optionally) not the expected tool and value."""
    if not calls:
        return ["no tool call at all"]
    problems = []
    for call in calls:
        fn = call.get("function") or {}
        name, raw = fn.get("name"), fn.get("arguments")
        if name not in SCHEMAS:
            problems.append(f"call to unknown tool {name!r}")
            continue
        try:
            args = json.loads(raw) if isinstance(raw, str) else raw
        except ValueError as exc:
            problems.append(f"{name}: arguments are not JSON ({exc}): {raw!r}")
            continue
        try:
            jsonschema.validate(args, SCHEMAS[name])
        except jsonschema.ValidationError as exc:
            problems.append(f"{name}: arguments {raw!r} do not validate against its schema: {exc.message}")
    first = (calls[0].get("function") or {})
    if expect_name and first.get("name") != expect_name:
        problems.append(f"called {first.get('name')!r}, the question needs {expect_name!r}")
    elif expect_value and expect_value.lower() not in str(first.get("arguments")).lower():
        problems.append(f"arguments {first.get('arguments')!r} do not carry {expect_value!r}")
    return problems


def tools_body(server, question, tools, **extra):
    return chat_body(server.served_name, question, max_tokens=96, tools=tools, **extra)


def ask(endpoint, body, label=""):
    """The answer's message, and why it fails if it does: a call cut off at max_tokens (its JSON unfinished, parsed or
    left in the content) is a model that loops, the garbage SERVE-SANITY diagnoses, not a parser that missed it."""
    choice = endpoint.chat(body, label, judged_here=OWN)["choices"][0]
    message = choice.get("message") or {}
    in_call = "<tool_call>" in str(message.get("content")) or any("arguments are not JSON" in p for p in
                                                                  call_problems(message.get("tool_calls")))
    cut = choice.get("finish_reason") == "length" and in_call
    return message, (sanity.CUT_SHORT_WHY if cut else None)


@pytest.mark.check("SERVE-TOOLS-REQUIRED", why="agents force a tool call with tool_choice=required; an answer "
                   "without one stalls the agent loop", fix=TOOLS_FIX)
def test_tool_choice_required_returns_valid_tool_calls(check, server, endpoint, tools_declared):
    """With tool_choice=required the answer MUST be tool_calls whose arguments validate against the schema."""
    body = tools_body(server, "What is the weather in Paris?", [weather_tool(strict=True), time_tool(strict=True)],
                      tool_choice="required")
    message, why = ask(endpoint, body)
    problems = call_problems(message.get("tool_calls"))
    check.that(not problems, expected="tool_calls[] with JSON arguments valid against the tool's schema",
               found=f"{'; '.join(problems)}; message {json.dumps(message)[:300]}", why=why)


@pytest.mark.check("SERVE-TOOLS-NAMED", why="clients name the function they need; a call to another, or "
                   "none, breaks them", fix=TOOLS_FIX)
def test_a_named_tool_choice_calls_that_function(check, server, endpoint, tools_declared):
    """With tool_choice naming a function the answer MUST be a call to that function with valid arguments."""
    body = tools_body(server, "What is the weather in Paris?", [weather_tool(strict=True), time_tool(strict=True)],
                      tool_choice={"type": "function", "function": {"name": "get_weather"}})
    message, why = ask(endpoint, body)
    problems = call_problems(message.get("tool_calls"), expect_name="get_weather", expect_value="Paris")
    check.that(not problems, expected="one get_weather call with valid arguments naming Paris",
               found=f"{'; '.join(problems)}; message {json.dumps(message)[:300]}", why=why)


@pytest.mark.check("SERVE-TOOLS-AUTO", why="with tool_choice=auto (what agents send) the model's call must be "
                   "parsed into tool_calls[]; the guide's broken server left it as `<tool_call>` text in the "
                   "content, where no agent looks", fix=TOOLS_FIX)
@pytest.mark.parametrize(("question", "expect_name", "expect_value"), [
    ("What is the weather in Paris?", "get_weather", "Paris"),
    ("What time is it in Tokyo?", "get_time", "Tokyo"),
], ids=["weather", "time"])
def test_tool_choice_auto_picks_the_right_tool_of_two(check, server, recipe, endpoint, tools_declared,
                                                       question, expect_name, expect_value):
    """With tool_choice=auto and two tools the answer MUST call the right tool with valid arguments."""
    # The conversation carries two earlier calls, as an agent's does: this tests that the server parses
    # the model's call, not whether a small model decides to call a tool unprompted.
    history = tool_history(recipe.arg("--tool-call-parser"))
    body = tools_body(server, question, [weather_tool(), time_tool()], tool_choice="auto")
    body["messages"][:0] = history
    message, why = ask(endpoint, body)
    problems = call_problems(message.get("tool_calls"), expect_name, expect_value)
    check.that(not problems, expected=f"a {expect_name} call naming {expect_value} in tool_calls[]",
               found=f"{'; '.join(problems)}; content {(message.get('content') or '')[:200]!r}", why=why)


@pytest.mark.check("SERVE-TOOLS-STREAM", why="streaming agents assemble a call from deltas: the first carries "
                   "id and name, the rest argument fragments; a stream that breaks this loses the call",
                   fix=TOOLS_FIX)
def test_streamed_tool_call_deltas_assemble_into_a_valid_call(check, server, endpoint, tools_declared):
    """Streamed tool-call deltas MUST assemble into a call with an id, a name and valid JSON arguments."""
    body = tools_body(server, "What is the weather in Paris?", [weather_tool(strict=True)], tool_choice="required")
    out = endpoint.stream(body, judged_here=OWN)
    calls = out.message["tool_calls"]
    problems = call_problems(calls, "get_weather") + [f"call {i} has no id" for i, c in enumerate(calls)
                                                        if not c.get("id")]
    cut = out.finish_reason == "length"
    check.that(out.done and not problems, expected="assembled tool_calls with id, name and valid arguments, "
               "then [DONE]", found=f"{'; '.join(problems) or 'no [DONE]'}; assembled {calls}"
               + (f"; content {(out.message.get('content') or '')[:200]!r}" if not calls else "")
               + (" (finish_reason: length)" if cut else ""), why=sanity.CUT_SHORT_WHY if cut else None)


@pytest.mark.check("SERVE-TOOLS-ROUNDTRIP", why="an agent sends the tool's result back and acts on the answer; "
                   "a server that mangles the tool turn makes the agent act on nothing", fix=TOOLS_FIX)
def test_a_tool_result_sent_back_is_used_in_the_answer(check, server, endpoint, tools_declared):
    """After a real tool call and its result, the answer MUST use the result."""
    tools = [weather_tool(strict=True)]
    first = tools_body(server, "What is the weather in Paris?", tools,
                       tool_choice={"type": "function", "function": {"name": "get_weather"}})
    message, why = ask(endpoint, first, "the call")
    calls = message.get("tool_calls") or []
    check.that(not call_problems(calls), expected="a valid get_weather call to answer",
               found=f"{call_problems(calls)}; message {json.dumps(message)[:300]}", why=why)
    call = calls[0]
    result = {"city": "Paris", "temperature_c": 31, "sky": "sunny"}  # 31: an unlikely guess
    second = {**tools_body(server, "", tools), "messages": [
        *first["messages"],
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call["id"], "content": json.dumps(result)},
        {"role": "user", "content": "So what is the temperature in Paris right now?"}]}
    answer = endpoint.chat(second, label="the answer after the tool result")["choices"][0]["message"]
    text = answer.get("content") or ""
    check.that("31" in text, expected="an answer that uses the tool result (31 °C)",
               found=f"{text[:200]!r}" + (f", tool_calls {answer.get('tool_calls')}" if answer.get("tool_calls")
                                          else ""))
