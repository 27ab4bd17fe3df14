"""The output sanity detector, both ways: real garbage is flagged, terse valid answers are not."""

import pytest

from sparkgate import sanity

# The guide's two garbage answers from Qwen3.8-27B under FULL_AND_PIECEWISE cudagraphs, verbatim.
GUIDE_SALAD = ".eth.ע\n\n3\n in\n to\nthe\nE\n\nE\n。\n压力.... Play the"
GUIDE_FINGERPRINT = "优化E\n with.\n.\n。.J it, a..\n\n<tool_call>\n\n\n\n\nP..\n\n. with"
# What a randomly initialised SmolLM2 served by vLLM's CPU engine answered (--load-format dummy).
RANDOM_WEIGHTS = "logupload" * 24

TERSE_AND_VALID = ["Got it.", "Test received.", "Paris", "391", "5", "OK", "Yes.", "No", "7 days.",
                   "It is 12 °C and cloudy in Berlin.", "π ≈ 3.14159, and Σ of 1..n is n(n+1)/2.",
                   "| a | b |\n| --- | --- |\n| 1 | 2 |", "-----\nDone.\n-----", "Wait...", "",
                   "def add(a, b):\n    return a + b\n"]


@pytest.mark.parametrize("text", TERSE_AND_VALID)
def test_terse_and_ordinary_answers_are_clean(text):
    assert sanity.scan(text, "Reply briefly.") == []


def test_the_guides_token_salad_is_flagged_for_its_foreign_scripts():
    kinds = {f.kind for f in sanity.scan(GUIDE_SALAD, "Say hello.")}
    assert kinds == {"script"}
    assert "Hebrew" in sanity.summary(sanity.scan(GUIDE_SALAD)) and "CJK" in sanity.summary(sanity.scan(GUIDE_SALAD))


def test_the_guides_fingerprint_is_named_as_the_tool_call_leak():
    findings = sanity.scan_message({"content": GUIDE_FINGERPRINT, "tool_calls": []}, "Fix the bug.")
    assert findings[0].kind == "tool-call-leak" and "fingerprint" in findings[0].what
    assert "CJK" in sanity.summary(findings)


def test_a_tool_call_parsed_into_tool_calls_is_not_a_leak():
    message = {"content": "<tool_call>", "tool_calls": [{"function": {"name": "get_weather", "arguments": "{}"}}]}
    assert all(f.kind != "tool-call-leak" for f in sanity.scan_message(message))


def test_the_random_weight_models_loop_is_degenerate_repetition():
    (finding,) = sanity.scan(RANDOM_WEIGHTS, "Say hello in one short sentence.")
    assert finding.kind == "repetition" and "'logupload'" in finding.what


@pytest.mark.parametrize(("text", "kind"), [("Paris\x00\x00", "nul"), ("Par\x07is", "control"),
                                            ("Par\ufffdis", "undecodable"), ("Hello<|im_end|>", "special-token"),
                                            ("שלום world", "script"), ("the the the the the the the the the the "
                                                                       "the the the the the the", "repetition")])
def test_each_kind_of_garbage_is_named(text, kind):
    assert [f.kind for f in sanity.scan(text, "Say hello.")] == [kind]


def test_a_script_the_prompt_uses_is_allowed_in_the_answer():
    assert sanity.scan("巴黎", "法国的首都是哪里？") == []
    assert sanity.scan("巴黎", "What is the capital of France?") != []


def test_reasoning_and_tool_arguments_are_scanned_too():
    message = {"content": "Paris", "reasoning": "压力压力", "tool_calls": [
        {"function": {"name": "get_weather", "arguments": '{"city": "Par\x00is"}'}}]}
    found = sanity.summary(sanity.scan_message(message, "Capital of France?"))
    assert "in the reasoning field" in found and "in tool call 'get_weather'" in found


def test_only_what_people_wrote_allows_a_script_not_what_a_tool_returned():
    body = {"messages": [{"role": "system", "content": "You are an agent."},
                         {"role": "user", "content": "Read the file."},
                         {"role": "tool", "content": "文件内容"}],
            "tools": [{"type": "function", "function": {"name": "read", "description": "读取"}}]}
    assert sanity.scan("压力 with.", sanity.prompt_text(body)) != []
    body["messages"][1]["content"] = "把文件读一下。"
    assert sanity.scan("压力", sanity.prompt_text(body)) == []


# Latin-script token salad, verbatim from selftest/garbage/corpus.jsonl: SmolLM2 with every weight matrix perturbed
# (noise-all-1.0) and under a permuted vocabulary (wrong-tokenizer), served by vLLM's CPU engine. No foreign script,
# no NUL, no loop: only the words give it away.
PERTURBED_SALAD = ("icule elratingacksonEndocon Governaticanone Ross transcendedtailed energy somewherecation "
                   "sesame verses Yosegrassatches GovernScaleteneg Howardractive catersatchewan peasantxizz "
                   "Wheneververages creamedsasciiDear Eating Klan Wheneverigan cond finer")
TOKENIZER_SALAD = " inauguration inauguration N CombineHungarian Vaserates rinseabolismHungarian ellip aquarium"
# Answers with code, numbers, names, URLs and identifiers in them, none of them salad.
TECHNICAL_AND_VALID = [
    "Use `kubectl rollout restart deployment/web` and then check https://example.com/status for the new pods.",
    "Nguyen and Okonkwo met Jürgen in Wrocław; they flew from Reykjavík to Thessaloniki on 12 March 2024.",
    "The function `getUserName()` returns the name; call it as user.getUserName() or via getattr(user, 'name').",
    "```python\ndef quotechar(skipinitialspace, lineterminator):\n    return xyzzy_frobnicate(skipinitialspace)\n```\n"
    "This helper returns the value unchanged.",
    "Set CUDA_VISIBLE_DEVICES=0, run vllm serve Qwen/Qwen3-8B --max-model-len 32768, and read /var/log/syslog.",
    "    for i in range(10):\n        total += weights[i] * xs[i]\nThe loop above sums the weighted values.",
    "The answer is 42, since 6 × 7 = 42 and 0x2A is the same number in hexadecimal notation.",
    "The ArgumentParser raises ArgumentError when an option is given twice and exits with status 2.",
]


@pytest.mark.parametrize("text", [PERTURBED_SALAD, TOKENIZER_SALAD], ids=["perturbed-weights", "wrong-tokenizer"])
def test_latin_script_token_salad_is_flagged_by_its_words(text):
    findings = sanity.scan(text, "What is the capital of France?")
    assert [f.kind for f in findings] == ["salad"]
    assert "words of no language" in findings[0].what


@pytest.mark.parametrize("text", TECHNICAL_AND_VALID)
def test_code_numbers_names_and_urls_are_not_salad(text):
    assert sanity.scan(text, "Answer the question.") == []


def test_a_loop_of_punctuation_among_words_is_repetition_but_a_rule_line_is_not():
    # what noise in the attention weights answered (selftest/garbage/corpus.jsonl), abridged
    attention_noise = " ( ( ( ( ( ( ( ( Hzs Hz Hz Hz Hz Hz Hz Hz Hz Hz Hz Hz Hz Hz Hz ( ( like" + " (" * 50
    assert [f.kind for f in sanity.scan(attention_noise)] == ["repetition"]
    assert sanity.scan("=" * 60 + "  " + "=" * 20 + "\nName      Meaning\n" + "-" * 80) == []


def test_a_special_token_quoted_as_code_is_talked_about_not_leaked():
    assert sanity.scan("The parser turns the model's `<tool_call>` block into tool_calls[].") == []
    assert [f.kind for f in sanity.scan("Sure. <tool_call> get_weather")] == ["special-token"]
