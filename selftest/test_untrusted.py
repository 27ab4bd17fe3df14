"""What the suite writes from strings it did not write (a secret, a server's answer, a contributor's file): masked
before it is quoted, escaped or serialised, and never markup or a formula in the documents people open. Properties,
with Hypothesis: any secret, any text (docs/SECURITY.md).
"""

from __future__ import annotations

import contextlib
import json
import re
import shlex
import subprocess
import sys
from types import SimpleNamespace

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from sparkgate import agent, link, redact, wallclock
from sparkgate.guard import Recorder
from sparkgate.launch.container_spec import SAVED_SUFFIX, docker_run
from sparkgate.launch.docker_launcher import restore_commands
from sparkgate.launch.process_launcher import ProcessLauncher
from sparkgate.measure import Figure
from sparkgate.recipes import load_profiles, load_recipes
from sparkgate.redact import HIDDEN, csv_text, mask_json, md_text
from sparkgate.report import summary_html
from sparkgate.results import MAX_BYTES, CheckResult, Measurement, Results, Suite, load

# A secret of any shape: quotes, backslashes, markup, spaces, non-ASCII; long enough to be registered.
SECRETS = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="*"), min_size=4, max_size=24)
DOCUMENTS = st.recursive(st.none() | st.booleans() | st.floats(allow_nan=False) | st.text(max_size=12),
                         lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                                      max_size=4), max_leaves=12)


@contextlib.contextmanager
def registered(value: str):
    """`value` registered as a secret for one example only (the masker is the process's)."""
    before = set(redact.MASKER.secrets)
    redact.secret(value)
    try:
        yield
    finally:
        redact.MASKER.secrets = before


def strings_in(value) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in (k, *strings_in(v))]
    if isinstance(value, list):
        return [s for v in value for s in strings_in(v)]
    return []


@settings(max_examples=200, deadline=None)
@given(secret=SECRETS, doc=DOCUMENTS)
def test_a_document_masked_before_it_is_serialised_is_valid_json_without_the_secret(secret, doc):
    """Wherever a secret sits (a key, a value, deep in a list), the masked document MUST serialise to JSON that parses,
    and no string in it may hold the secret."""
    planted = {"env": {secret: doc, "HF_TOKEN": secret}, "args": ["--api-key", secret, [f"x{secret}y"]], "doc": doc}
    with registered(secret):
        parsed = json.loads(json.dumps(mask_json(planted), ensure_ascii=False))
    assert not [s for s in strings_in(parsed) if secret in s]


def _recipe():
    return load_recipes(profiles=load_profiles())["qwen38-27b-nvfp4"]


@settings(max_examples=200, deadline=None)
@given(secret=SECRETS.filter(lambda s: s.strip() == s and "\x00" not in s))
def test_the_docker_run_line_shows_no_part_of_a_secret_that_holds_quotes(secret):
    """A secret in the env (by its name) and after --api-key MUST be hidden whole, whatever quotes it holds: the line
    is masked token by token, then quoted."""
    r = _recipe()
    r = r.model_copy(update={"env": {**r.env, "HF_TOKEN": secret},
                             "serve_args": [*r.serve_args, "--api-key", secret]})
    with registered(secret):
        line = docker_run(r)
    tokens = shlex.split(line)
    assert not [t for t in tokens if secret in t], line
    assert "HF_TOKEN=" + HIDDEN in tokens and tokens[tokens.index("--api-key") + 1] == HIDDEN


def test_a_quote_in_a_secret_leaves_no_half_of_it_on_the_docker_run_line():
    r = _recipe()
    r = r.model_copy(update={"env": {**r.env, "HF_TOKEN": "hf_Zq9'Xw\"Vb"}, "serve_args": ["--api-key", "Pk7'Lm\"Qn"]})
    line = docker_run(r)  # not registered: masked by the env name and the flag alone
    for fragment in ("Zq9", "Xw", "Vb", "Pk7", "Lm", "Qn"):
        assert fragment not in line, (fragment, line)


@settings(max_examples=300, deadline=None)
@given(text=st.text())
def test_markdown_text_is_one_line_with_no_raw_markup_and_every_bar_escaped(text):
    out = md_text(text)
    assert "\n" not in out and "\r" not in out and "<" not in out and ">" not in out
    assert all(out[i - 1] == "\\" for i, c in enumerate(out) if c == "|")


@settings(max_examples=300, deadline=None)
@given(text=st.text())
def test_a_csv_cell_never_starts_a_formula(text):
    out = csv_text(text)
    assert out[:1] not in ("=", "@", "\t", "\r")
    if out[:1] in ("+", "-"):
        float(out)  # only a number may lead with a sign


def test_the_html_summary_masks_a_secret_holding_markup_characters_before_escaping_it():
    secret = 'p&<w>"d-Secret'
    outcome = CheckResult(id="SERVE-CHAT", test="tests/serving/x.py::t[r]", recipe="r", outcome="failed",
                          message=f"the server said: {secret}")
    with registered(secret):
        page = summary_html([outcome], [])
    assert secret not in page and "p&amp;&lt;w&gt;&quot;d-Secret" not in page and HIDDEN in page, page[-2000:]


@settings(max_examples=100, deadline=None)
# (a password in a URL holds no unescaped "/", "@", ":" or space)
@given(secret=SECRETS.filter(lambda s: s.isprintable() and not {"/", "@", ":", " "} & set(s)))
def test_the_guard_stores_a_body_that_parses_and_holds_no_secret_wherever_it_sits(tmp_path_factory, secret):
    """Under a hyphenated or any-case key, nested, in a list, as a URL's password: not registered anywhere, the stored
    body MUST hold no trace of the secret, and MUST parse (SERVE-REPRO replays it)."""
    def body_with(value: str) -> dict:
        return {"model": "m", "messages": [{"role": "user", "content": "hi"}], "api-key": value,
                "extra_body": {"Hf_Token": value, "tools": [{"password": value}]},
                "metadata": {"callback": f"https://ops:{value}@hooks.example/x"}}

    body = body_with(secret)
    assume(secret not in json.dumps(body_with("***")))  # a secret like "mess" is in "messages": that is no leak
    recorder = Recorder(tmp_path_factory.mktemp("guard"), "http://127.0.0.1:9")
    stored = recorder.store(body, {"content": "ok"}, [])
    text = stored.read_text()
    kept = json.loads(text)
    assert secret not in text, text
    assert kept["messages"] == body["messages"] and kept["metadata"]["callback"] == "https://ops:***@hooks.example/x"


# ---- contributors' results files ---------------------------------------------------------------------------------

def _a_results_document() -> dict:
    figure = Figure.of("natural decode, per request", "tok/s", [20.0, 22.0, 24.0], {"prompt": "prose"})
    results = Results(suite=Suite(version="0.1", commit="abc"), started="2026-12-01T00:00:00+00:00",
                      measurements=[Measurement(**figure.model_dump(), recipe="r", check="PERF-NATURAL")])
    return json.loads(results.model_dump_json())


@pytest.mark.parametrize(("change", "words"), [
    (lambda m: m.update(mean="NaN"), "finite"),
    (lambda m: m.update(n=4), "n is 4 and there are 3 raw values"),
    (lambda m: m.update(mean=30.0), "mean is 30, and its raw values give 22"),
    (lambda m: m.update(std=0.0), "std is 0, and its raw values give 2"),
    (lambda m: m["raw"].__setitem__(0, "Infinity"), "finite"),
    (lambda m: m.update(n=2, raw=[1.7e308, 1.7e308], mean=1.7e308, std=0.0), "its raw values have no mean or std"),
], ids=["nan-mean", "n-disagrees", "mean-disagrees", "std-disagrees", "infinite-raw", "overflowing-raw"])
def test_a_figure_that_cannot_be_true_is_refused_with_what_is_wrong(tmp_path, change, words):
    doc = _a_results_document()
    change(doc["measurements"][0])
    path = tmp_path / "theirs.json"
    path.write_text(json.dumps(doc).replace('"NaN"', "NaN").replace('"Infinity"', "Infinity"))
    with pytest.raises(ValidationError, match=words):
        load(path)


def test_a_file_too_large_or_not_utf8_is_refused_with_one_line(tmp_path):
    big, binary = tmp_path / "big.json", tmp_path / "binary.json"
    with big.open("wb") as f:
        f.truncate(MAX_BYTES + 1)
    binary.write_bytes(b'{"suite": "\xff\xfe"}')
    for path, words in ((big, "larger than any results file"), (binary, "not UTF-8 text")):
        with pytest.raises(ValueError, match=words):
            load(path)
        result = subprocess.run([sys.executable, "-m", "sparkgate.cli", "validate", str(path)], capture_output=True,
                                text=True, timeout=60)
        assert result.returncode == 2 and words in result.stderr and "Traceback" not in result.stderr, result.stderr


@settings(max_examples=200, deadline=None)
@given(doc=st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
                            st.sampled_from(["suite", "started", "measurements", "checks", "n", "mean", "raw",
                                             "schema_version", "x"]), inner, max_size=4), max_leaves=10))
def test_an_arbitrary_document_is_a_results_file_or_one_clear_error(tmp_path_factory, doc):
    path = tmp_path_factory.mktemp("doc") / "any.json"
    path.write_text(json.dumps(doc))
    try:
        load(path)
    except (ValidationError, ValueError):
        pass  # the clear errors `sparkgate validate` and `compare` turn into one line and exit 2


@settings(max_examples=200, deadline=None)
@given(name=st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), min_size=1,
                    max_size=30))
def test_the_commands_printed_to_paste_keep_any_container_name_one_word(name):
    """Whatever a name holds (`; curl ... | sh` included), each printed command MUST split back into exactly
    `docker VERB NAME...` with the name intact."""
    lexer = shlex.shlex(restore_commands(name), posix=True, punctuation_chars=";")
    lexer.whitespace_split = True
    tokens = list(lexer)
    assert tokens == ["docker", "rm", "-f", name, ";", "docker", "rename", name + SAVED_SUFFIX, name, ";", "docker",
                      "start", name], tokens


def test_a_process_recipes_command_line_keeps_its_environment_pasteable():
    """`NAME=value` leads the line unquoted (a shell reads a quoted one as a command), the value quoted."""
    r = load_recipes(profiles=load_profiles())["smollm2-cpu"]
    r = r.model_copy(update={"env": {**r.env, "VLLM_CPU_OMP_THREADS_BIND": "0-3|4-7", "HF_TOKEN": "hf_Zq9'Xw"}})
    line = ProcessLauncher(r).describe()
    assert "VLLM_CPU_OMP_THREADS_BIND='0-3|4-7' " in line and "HF_TOKEN=*** " in line and "Zq9" not in line, line


# Arbitrary text, and text around the words the parsers look for, so that their every branch sees hostile input.
TOOL_WORDS = st.sampled_from(["dev ", "via ", "via inet6 ", "local ", "unreachable ", " mtu ", "local error: ",
                              " packets transmitted, ", " received", "/sys/class/net/", "/device/infiniband", "\n"])
TOOL_TEXT = st.lists(st.one_of(TOOL_WORDS, st.text(max_size=20), st.from_regex(r"[0-9]{1,8}", fullmatch=True)),
                     max_size=12).map("".join)


@settings(max_examples=500, deadline=None)
@given(text=TOOL_TEXT, rc=st.integers(0, 255))
def test_what_the_box_says_of_its_link_is_read_or_refused_never_a_crash_and_printed_inert(text, rc):
    """`ip route get`, `ip link show`, the RDMA listing and ping's answers are the box's: any text MUST parse to a
    route (an interface name the kernel allows, or none with the reason), an MTU or none, interface names, a ping's
    counts, with nothing unprintable in what a message would carry."""
    route = link.parse_route("10.0.0.2", text)
    assert route.dev is None or re.fullmatch(link.INTERFACE, route.dev, re.ASCII)
    assert (route.dev is None) == bool(route.error) and route.error.isascii() and route.error.isprintable()
    assert all(re.fullmatch(link.INTERFACE, dev, re.ASCII) for dev in link.parse_devices(text))
    mtu = link.parse_mtu(text)
    assert mtu is None or str(mtu) in text
    ping = link.parse_ping(8972, rc, text, text[::-1])
    summary = re.search(r"\d+ packets transmitted, \d+ (packets )?received", text, re.ASCII)
    assert ping.refused == (summary is None) and (ping.sent, ping.received) >= (0, 0)
    assert ping.error.isascii() and ping.error.isprintable()


@settings(max_examples=300, deadline=None)
@given(text=st.one_of(st.text(max_size=30), st.from_regex(r"[0-9]{1,12}\.[0-9]{9}\n?", fullmatch=True)),
       rc=st.integers(0, 255))
def test_what_the_box_says_its_time_is_is_read_or_refused_never_a_crash_and_printed_inert(text, rc):
    """`date +%s.%N` and timedatectl answer for the box: any text MUST give an offset only from a reading that exited
    0 and is digits, a point and nine digits, else a refusal in printable words; time sync is known only from a plain
    yes or no."""
    said = SimpleNamespace(stdout=text, stderr=text[::-1], rc=rc)
    reading = wallclock.offset(lambda _command: said, wall=lambda: 100.0, monotonic=iter([0.0, 0.5] * 3).__next__)
    if rc == 0 and re.fullmatch(r"[0-9]+\.[0-9]{9}", text.strip(), re.ASCII) and len(text.strip()) <= 22:
        assert (reading.seconds, reading.within) == (pytest.approx(float(text) - 100.25), 0.25)
    else:
        assert reading.seconds is None and reading.error.isascii() and reading.error.isprintable()
    word = text.strip() if rc == 0 else ""
    assert wallclock.synchronized(lambda _command: said) is {"yes": True, "no": False}.get(word)


CALL_WORDS = st.sampled_from(["get_capital", "get_temperature", "country", "city", "Paris", "<tool_call>", "{", "}"])
MESSAGES = st.recursive(st.none() | st.booleans() | st.integers() | CALL_WORDS | st.text(max_size=12),
                        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
                            st.sampled_from(["content", "tool_calls", "function", "name", "arguments", "id", "x"]),
                            inner, max_size=4), max_leaves=16)


@settings(max_examples=400, deadline=None)
@given(answers=st.lists(st.dictionaries(st.sampled_from(["message", "finish_reason"]), st.dictionaries(
    st.sampled_from(["content", "tool_calls", "role"]), MESSAGES, max_size=3) | MESSAGES, max_size=2),
    min_size=1, max_size=agent.MAX_TURNS))
def test_an_agent_episode_reads_any_messages_a_server_returns_and_ends_within_its_turns(answers):
    """A server's answers are untrusted: whatever their shape, the harness repairs or ends the episode, never raises,
    asks no more than MAX_TURNS times, and describes it in printable text (a server's escape codes quoted)."""
    asked = []

    def send(messages):
        json.dumps(messages)  # what goes back to the server is always JSON
        asked.append(messages)
        return answers[min(len(asked), len(answers)) - 1]
    episode = agent.run(agent.tasks(1)[0], send, "hermes")
    assert len(asked) == episode.turns <= agent.MAX_TURNS
    assert episode.describe().isprintable() and episode.completed in (True, False)
