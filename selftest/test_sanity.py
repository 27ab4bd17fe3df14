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


def test_thinking_left_in_the_content_is_one_reasoning_leak_and_thinking_split_off_is_none():
    """What a reasoning model served without its reasoning parser answers (selftest/thinker.py's, recorded)."""
    leaked = {"content": "<think>\nThe question asks for 2 plus 3. 2 + 3 = 5.\n</think>\n\n5", "reasoning": None}
    [finding] = sanity.scan_message(leaked)
    assert finding.kind == "reasoning-leak" and "a literal <think> at char 0" in finding.what
    assert sanity.thinking_in_content(leaked["content"]) == "The question asks for 2 plus 3. 2 + 3 = 5."
    split = {"content": "\n\n5", "reasoning": "\nThe question asks for 2 plus 3. 2 + 3 = 5.\n"}
    assert sanity.scan_message(split) == [] and sanity.thinking_in_content(split["content"]) == ""


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


# Punctuation noise: what a model whose logits went NaN answers greedily when its token 0 is "!" (served for real:
# selftest/garbage/corpus.py's nan-logits), and a broken MoE kernel's "!!!!!!!" and Unicode noise (NVIDIA/cutlass#3227).
PUNCTUATION_NOISE = ["!" * 80, "The capital of France is" + "!" * 30, ",,,,,,,,,,,,", "? ? ? ? ? ? ? ? ? ?",
                     "!\n!\n!\n!\n!\n!\n!\n!\n!", "⁇⁇⁇⁇⁇⁇⁇⁇⁇⁇", "A compiler ¿¡§¶¤¿¡§¶¤ translates"]
# Punctuation that is layout, code or emphasis, never noise.
PUNCTUATION_CLEAN = ["-" * 60, "| a | b |\n|:---|---:|\n| 1 | 2 |", "Wait... what?! Really?!", "Yes!!!",
                     "Chapter 1 ................................ 5", "* * *", "~~~~~~~~\nResults", "████████░░ 80%",
                     "src/\n├── a.py\n└── b.py", '{"a": {"b": [{"c": {"d": [[1]]}}]}}', "x = !!flag && !(a || b);",
                     "```\n!!!!!!!!!!!!!!!!!!!!\n```", "Happy birthday! 🎉🎂🎈🎁🥳🎊🎉🎂", "⠓⠑⠇⠇⠕ ⠺⠕⠗⠇⠙ ⠓⠑⠇⠇⠕",
                     "name,email,,,notes", '["", "", "", "", "", "", "", "", "", "", ""]',
                     "///////////////////////\n// Networking\n///////////////////////"]


@pytest.mark.parametrize("text", PUNCTUATION_NOISE)
def test_a_run_of_punctuation_noise_is_flagged_once_as_punctuation(text):
    findings = sanity.scan(text, "Answer the question.")
    assert [f.kind for f in findings] == ["punctuation"], findings
    assert "punctuation noise" in findings[0].what and "NaN logits" in findings[0].what


@pytest.mark.parametrize("text", PUNCTUATION_CLEAN)
def test_rules_tables_leaders_bars_code_and_emphasis_are_not_punctuation_noise(text):
    assert sanity.scan(text, "Answer the question.") == []


# A detokenizer that did not run, as vLLM served the embedded default with its tokenizer's decoder removed (no-decoder)
# or replaced by SentencePiece's (sentencepiece-decoder), and SentencePiece's own marker.
BPE_MARKED = ["The Ġcapital Ġof ĠFrance Ġis ĠParis . Ċ It Ġhas Ġ 2 Ġmillion Ġpeople .",
              " 1 . ĠBan ana Ċ 2 . ĠApple Ċ 3 . ĠGra pe fruit",  # no-decoder's three fruits, verbatim
              "TheĠcapitalĠofĠFranceĠisĠParis.ĊItĠhasĠ2ĠmillionĠpeople.",
              "▁The▁sky▁looks▁blue▁because▁air▁scatters▁blue▁light."]
# The same characters, quoted or in words of their own, or drawing a chart.
BPE_CLEAN = ["GPT-2 writes a leading space as Ġ and a newline as Ċ, so ' hello' is the one token Ġhello.",
             "SentencePiece turns 'new york' into ▁new and ▁york, and back again when it decodes.",
             "Ġorġ Borg Olivier led Malta to independence; Maltese writes ġ and ċ with a dot.",
             "Requests per hour: ▁▁▂▁▁▃▁▁▅▇█▇▅▃▂▁▁", "Print the tokens: `['ĠThe', 'Ġcat', 'Ġsat', 'Ġdown']`."]


@pytest.mark.parametrize("text", BPE_MARKED)
def test_tokenizer_markers_left_on_the_words_are_flagged(text):
    findings = sanity.scan(text, "What is the capital of France?")
    assert [f.kind for f in findings] == ["bpe-marker"], findings
    assert "detokenizer" in findings[0].what


@pytest.mark.parametrize("text", BPE_CLEAN)
def test_a_marker_quoted_named_or_charted_is_not_a_tokenizer_leak(text):
    assert sanity.scan(text, "Explain tokenizers.") == []


# Real words in no grammatical order (none of the short words every sentence holds).
WORD_SALAD = ("window seventeen quietly elephant distribute bright kitchen however orange sleeping governments purple "
              "mountain carefully ancient river telephone yesterday happily engine green")
# Word lists, headline bullets, keywords and noun-heavy prose: few function words, and no salad.
FEW_FUNCTION_WORDS = [
    "- Faster cold start times\n- Lower memory usage overall\n- Clearer error messages everywhere\n- New plugin system",
    "python, packaging, pyproject, wheels, sdist, setuptools, hatch, poetry, versioning, dependencies, virtualenv",
    "Compact aluminium body. Twelve-hour battery life. Dual-band wireless networking. Backlit keyboard with "
    "adjustable brightness. Fast charging via USB-C. Two-year limited warranty.",
    "Flour\nMilk\nEggs\nButter\nSugar\nBaking powder\nSalt\nMaple syrup\nFresh blueberries\nWhipped cream",
]


def test_real_words_in_no_grammatical_order_are_word_salad():
    findings = sanity.scan(WORD_SALAD, "Explain what an API is.")
    assert [f.kind for f in findings] == ["word-salad"] and "no grammatical order" in findings[0].what


@pytest.mark.parametrize("text", FEW_FUNCTION_WORDS)
def test_lists_bullets_keywords_and_terse_prose_are_not_word_salad(text):
    assert sanity.scan(text, "Answer the question.") == []


@pytest.mark.parametrize(("prompt", "answer"), [
    ("Translate 'Where is the station?' into Japanese.", "駅はどこですか？"),
    ("How do you say thank you in Hebrew?", "In Hebrew, thank you is תודה (toda)."),
    ("Answer in Russian, please: what is the capital of Russia?", "Столица России: Москва."),
    ("What is the Korean for 'see you tomorrow'?", "내일 봐요."),
    ("Write 'peace' in Arabic and in Chinese.", "Arabic: سلام. Chinese: 和平."),
])
def test_a_script_the_request_asks_for_by_language_is_allowed(prompt, answer):
    assert sanity.scan(answer, prompt) == []
    assert [f.kind for f in sanity.scan(answer, "Answer the question.")] and all(
        f.kind == "script" for f in sanity.scan(answer, "Answer the question."))


@pytest.mark.parametrize(("prompt", "answer", "foreign"), [
    ("Translate 'thank you' into Japanese.", "ありがとう שלום", "Hebrew"),
    ("How do you say hello in Korean?", "안녕하세요 压力优化", "CJK"),
    ("Translate 'good night' into Spanish.", "Buenas noches. Спокойной ночи.", "Cyrillic"),
])
def test_a_script_nobody_asked_for_is_still_flagged(prompt, answer, foreign):
    findings = sanity.scan(answer, prompt)
    assert [f.kind for f in findings] == ["script"] and foreign in findings[0].what


FINNISH = "Tänään on ihana sää, joten kävelemme lounaan jälkeen järvelle ja uimme hetken."


def test_words_of_a_language_the_request_asks_for_are_words():
    assert [f.kind for f in sanity.scan(FINNISH, "What is the weather like?")] == ["salad"]
    assert sanity.scan(FINNISH, "Say it in Finnish: the weather is lovely, we walk to the lake and swim.") == []
    assert sanity.scan(FINNISH, "Mikä sää tänään on, ja mitä teemme lounaan jälkeen?") == []  # asked in it


def test_a_tool_call_quoted_as_code_in_content_is_not_the_fingerprint():
    message = {"content": "The parser turns a `<tool_call>` block into tool_calls[].", "tool_calls": []}
    assert sanity.scan_message(message) == []
    assert sanity.scan_message({"content": "Sure. <tool_call>", "tool_calls": []})[0].kind == "tool-call-leak"
