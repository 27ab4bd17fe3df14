"""The garbage corpus: what real broken models answered, and real clean text, to measure the sanity detector on.

Every broken model is the embedded default (SmolLM2-135M-Instruct) broken one way, served by the real vLLM CPU
engine, asked the same prompts greedily:

- weights perturbed with Gaussian noise (a share of each tensor's own standard deviation) at several strengths,
  in all layers, only attention, only the MLPs, only the embeddings (tied to the output head), only the last layers;
- weights drawn fresh from the architecture's initialiser (transformers), and vLLM's dummy loader;
- the real weights under a chat template of another family, under a tokenizer whose vocabulary is permuted, under
  one without its decoder, and under SentencePiece's decoder;
- every logit NaN, under a vocabulary whose token 0 is "!".

The clean side is the real model's answers to the same prompts, and human text: the docstrings and code of Python's
standard library, the paragraphs of this project's docs (prose, tables, commands), and answers written for the corpus
(selftest/garbage/written.py, with the garbage the real engine cannot be made to print here).

    python -m selftest.garbage.corpus build [--only VARIANT ...]  # ~20 minutes on two cores; writes CORPUS
    python -m selftest.garbage.corpus human       # the human and written rows read again (after the docs change)
    python -m selftest.garbage.corpus matrix      # the detector's and the guard's rates, as docs/GARBAGE.md shows them
"""

from __future__ import annotations

import argparse
import json
import random
import re
import shutil
import sys
import tempfile
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import yaml

from sparkgate.probes import chat_body
from sparkgate.sanity import JUDGED_TOKENS

from . import written

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
CORPUS = HERE / "corpus.jsonl"
PORT = 18190
SEED = 20261201

# Varied prompts a user sends: short answers, explanations, lists, instructions, code, a little of everything.
PROMPTS = (
    "What is the capital of France?", "Explain why the sky is blue in two sentences.",
    "List three fruits, one per line.", "Write a Python function that reverses a string.",
    "What is photosynthesis?", "Give me a short tip for better sleep.", "Describe a cat to a child.",
    "How do I make a cup of tea?", "Write a haiku about autumn.", "What does a compiler do?",
    "Summarise the plot of Cinderella in three sentences.", "Name two planets in our solar system.",
    "Write a shell command that counts the lines of a file.", "What is the boiling point of water?",
    "Why do leaves change colour in autumn?", "Give three reasons to learn a second language.",
    "Explain what an API is to a beginner.", "Write a SQL query that selects all rows from a table named users.",
    "What is 12 times 12?", "Describe the water cycle.", "How do vaccines work, briefly?",
    "Write a JavaScript function that adds two numbers.", "What is the difference between a list and a tuple "
    "in Python?", "Tell me a fun fact about octopuses.", "How should I prepare for a job interview?",
    "What is a black hole?", "Write a short thank-you note to a colleague.", "Explain recursion with an example.",
    "What are the primary colours?", "Translate 'good morning' into Spanish.", "What causes earthquakes?",
    "Write a Python class for a bank account with deposit and withdraw methods.", "What is the speed of light?",
    "Suggest a name for a friendly robot.", "How does a refrigerator keep food cold?",
    "Give me a recipe idea for dinner with rice and beans.", "What is machine learning?",
    "Write a regular expression that matches an email address.", "Why is exercise good for you?",
    "Explain what HTTP status 404 means.", "Describe your ideal weekend in two sentences.",
    "What is the largest ocean on Earth?", "Write a function in C that returns the maximum of two integers.",
    "How do birds fly?", "What is the meaning of the word 'ephemeral'?", "Write a limerick about a dog.",
    "What is Git used for?", "List the days of the week.", "Explain inflation in simple terms.",
    "Reply with exactly: Got it.", "Say hello.", "Convert 5 kilometres to miles.",
    "What is a prime number? Give two examples.", "Write a YAML file that lists three colours.",
    "How do I center a div in CSS?", "What is the chemical symbol for gold?", "Why do we have seasons?",
    "Write a docstring for a function that sorts a list of numbers.", "What is the Pythagorean theorem?",
    "Give me two tips for writing clear emails.",
)

LLAMA2_TEMPLATE = ("{% for m in messages %}{% if m['role'] == 'user' %}[INST] {{ m['content'] }} [/INST]"
                   "{% else %}{{ m['content'] }}{% endif %}{% endfor %}")


def _weights(folder: Path) -> dict:
    from safetensors.torch import load_file

    [path] = folder.glob("*.safetensors")
    return load_file(path)


def _save(tensors: dict, src: Path, dst: Path) -> None:
    from safetensors.torch import save_file

    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("*.safetensors"))
    save_file({k: v.contiguous() for k, v in tensors.items()}, dst / "model.safetensors", metadata={"format": "pt"})


def perturbed(where: Callable[[str], bool], strength: float) -> Callable[[Path, Path], list[str]]:
    """Add N(0, (strength x the tensor's own std)^2) to every weight matrix whose name `where` accepts."""
    def make(src: Path, dst: Path) -> list[str]:
        import torch

        torch.manual_seed(SEED)
        tensors = _weights(src)
        for name, w in tensors.items():
            if w.dim() == 2 and where(name):
                w32 = w.float()
                tensors[name] = (w32 + strength * w32.std() * torch.randn_like(w32)).to(w.dtype)
        _save(tensors, src, dst)
        return []
    return make


def reinitialised(src: Path, dst: Path) -> list[str]:
    """The architecture's own initialiser, as a model that was never trained (transformers)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(SEED)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(src), dtype=torch.bfloat16)
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("*.safetensors"))
    model.save_pretrained(dst)
    return []


def real(src: Path, dst: Path) -> list[str]:
    shutil.copytree(src, dst)
    return []


def dummy_loader(src: Path, dst: Path) -> list[str]:
    shutil.copytree(src, dst)
    return ["--load-format", "dummy"]


def wrong_template(src: Path, dst: Path) -> list[str]:
    shutil.copytree(src, dst)
    (dst / "llama2.jinja").write_text(LLAMA2_TEMPLATE)
    return ["--chat-template", str(dst / "llama2.jinja")]


def _edit_tokenizer(folder: Path, edit: Callable[[dict], object]) -> None:
    data = json.loads((folder / "tokenizer.json").read_text())
    edit(data)
    (folder / "tokenizer.json").write_text(json.dumps(data))


def tokenizer_edited(edit: Callable[[dict], object]) -> Callable[[Path, Path], list[str]]:
    """The real weights under the tokenizer.json that `edit` changes in place."""
    def make(src: Path, dst: Path) -> list[str]:
        shutil.copytree(src, dst)
        _edit_tokenizer(dst, edit)
        return []
    return make


def permuted(data: dict) -> None:
    """The vocabulary permuted (special tokens kept): every id now reads as another token."""
    special = {t["content"] for t in data.get("added_tokens", [])}
    vocab = data["model"]["vocab"]
    plain = [t for t in vocab if t not in special]
    ids = [vocab[t] for t in plain]
    random.Random(SEED).shuffle(ids)
    vocab.update(zip(plain, ids, strict=True))


def no_decoder(data: dict) -> None:
    """No decoder: the byte-level markers (Ġ for a space, Ċ for a newline) are printed as they are."""
    data["decoder"] = None


def sentencepiece_decoder(data: dict) -> None:
    """SentencePiece's decoder on a byte-level vocabulary (a tokenizer.json assembled from another family): it turns
    only ▁ into spaces, so the byte-level markers stay and the words run together."""
    data["decoder"] = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always", "split": True}


def nan_logits(src: Path, dst: Path) -> list[str]:
    """Every logit NaN (the final norm's weights NaN, as an overflowing kernel leaves them) under a vocabulary whose
    token 0 is "!", as Llama 3's and Qwen's are (SmolLM2's token 0, <|endoftext|>, trades ids with its "!"): greedy
    decoding takes the argmax of NaNs, token 0, every time."""
    import torch

    tensors = _weights(src)
    bang = json.loads((src / "tokenizer.json").read_text())["model"]["vocab"]["!"]
    embed = tensors["model.embed_tokens.weight"].clone()  # tied to the output head: rows trade places with the ids
    embed[[0, bang]] = embed[[bang, 0]]
    tensors["model.embed_tokens.weight"] = embed
    tensors["model.norm.weight"] = torch.full_like(tensors["model.norm.weight"], float("nan"))
    _save(tensors, src, dst)

    def swap(data: dict) -> None:
        vocab = data["model"]["vocab"]
        zero = next(t for t, i in vocab.items() if i == 0)
        vocab[zero], vocab["!"] = bang, 0
        for token in data["added_tokens"]:
            token["id"] = {0: bang, bang: 0}.get(token["id"], token["id"])

    _edit_tokenizer(dst, swap)
    config = json.loads((dst / "config.json").read_text())
    config["unk_token_id"] = bang
    (dst / "config.json").write_text(json.dumps(config))
    return []


def layer(name: str, first: int) -> bool:
    m = re.search(r"layers\.(\d+)\.", name)
    return bool(m) and int(m.group(1)) >= first


def everywhere(_name: str) -> bool:
    return True


# The damage the serving self-tests use: Latin-script token salad, no foreign script (chosen from the matrix).
DAMAGED = (everywhere, 1.0)

VARIANTS: dict[str, tuple[str, Callable[[Path, Path], list[str]]]] = {
    # variant: (kind, how to make it)
    "real-model": ("clean", real),
    "noise-all-0.25": ("perturbed", perturbed(everywhere, 0.25)),
    "noise-all-0.5": ("perturbed", perturbed(everywhere, 0.5)),
    "noise-all-1.0": ("perturbed", perturbed(everywhere, 1.0)),
    "noise-attention-1.0": ("perturbed", perturbed(lambda n: "self_attn" in n, 1.0)),
    "noise-mlp-1.0": ("perturbed", perturbed(lambda n: ".mlp." in n, 1.0)),
    "noise-embeddings-0.5": ("perturbed", perturbed(lambda n: "embed_tokens" in n, 0.5)),
    "noise-last-layers-2.0": ("perturbed", perturbed(lambda n: layer(n, 20), 2.0)),
    "random-init": ("random", reinitialised),
    "dummy-loader": ("random", dummy_loader),
    "wrong-chat-template": ("misconfigured", wrong_template),
    "wrong-tokenizer": ("misconfigured", tokenizer_edited(permuted)),
    "no-decoder": ("misconfigured", tokenizer_edited(no_decoder)),
    "sentencepiece-decoder": ("misconfigured", tokenizer_edited(sentencepiece_decoder)),
    "nan-logits": ("numerics", nan_logits),
}


def answers(base_url: str, model: str) -> list[str]:
    def ask(prompt: str) -> str:
        body = chat_body(model, prompt, JUDGED_TOKENS)
        response = httpx.post(f"{base_url}/v1/chat/completions", json=body, timeout=300)
        if response.status_code != 200:
            return ""
        return response.json()["choices"][0]["message"].get("content") or ""

    with ThreadPoolExecutor(max_workers=4) as pool:
        return list(pool.map(ask, PROMPTS))


def build(only: list[str]) -> None:
    from sparkgate import embedded
    from sparkgate.launch import serving
    from sparkgate.proc import cache_dir
    from sparkgate.recipes import RECIPES_DIR, Recipe, load_profiles

    from ..helpers import local_mem_available, move_port

    src = embedded.prepare("embedded:smollm2", cache_dir())
    base = yaml.safe_load((RECIPES_DIR / "smollm2-cpu.yaml").read_text())
    kept = [json.loads(line) for line in CORPUS.read_text().splitlines()] if CORPUS.exists() else []
    kept = [r for r in kept if r["variant"] not in (only or VARIANTS)]
    for name, (kind, make) in VARIANTS.items():
        if only and name not in only:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp) / name
            extra = make(src, folder)
            data = {**base, "name": "corpus", "serve_args": [*base["serve_args"], *extra]}
            data["model"] = {**base["model"], "id": str(folder), "source": None}
            move_port(data, PORT)
            recipe = Recipe.model_validate(data)
            with serving(recipe, load_profiles()["cpu"], local_mem_available, print, 900) as srv:
                texts = answers(srv.base_url, srv.served_name)
        kept += [{"kind": kind, "variant": name, "prompt": p, "text": t} for p, t in zip(PROMPTS, texts, strict=True)]
        print(f"{name}: {len(texts)} answers", flush=True)
    _write(kept)
    refresh_human()


def _write(rows: list[dict]) -> None:
    CORPUS.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


def refresh_human() -> None:
    """The rows no engine made read again from their sources (seconds): human text (after the project's docs change)
    and the answers written for the corpus (selftest/garbage/written.py)."""
    kept = [r for r in (json.loads(line) for line in CORPUS.read_text().splitlines())
            if r["kind"] not in ("human", "written") and not r["variant"].startswith("written: ")]
    _write(kept + [{"kind": "human", "variant": variant, "source": source, "prompt": "", "text": text}
                   for variant, source, text in human_text()]
           + [{"kind": kind, "variant": variant, "source": "selftest/garbage/written.py", "prompt": prompt,
               "text": text} for kind, variant, prompt, text in written.ROWS])


# Human text everyone has: the docstrings and the code of Python's standard library, and this project's docs.
STDLIB_PROSE = ("argparse", "asyncio", "collections", "csv", "dataclasses", "email", "functools", "http.server",
                "json", "logging", "pathlib", "statistics", "subprocess", "textwrap", "unittest", "urllib.request")
STDLIB_CODE = ("textwrap.dedent", "json.dumps", "statistics.median", "shutil.which", "shutil.copytree",
               "functools.total_ordering", "csv.DictReader.__next__", "pathlib.Path.glob", "string.capwords",
               "difflib.get_close_matches", "heapq.nsmallest", "base64.b64encode")


def human_text() -> list[tuple[str, str, str]]:
    """Paragraphs people wrote (prose, tables, commands, code): the standard library's docstrings and code, and
    this project's docs: (variant, source, text)."""
    import importlib
    import inspect

    out = []
    for name in STDLIB_PROSE:
        doc = importlib.import_module(name).__doc__ or ""
        out += [("python docstrings", name, p.strip()) for p in re.split(r"\n\s*\n", doc) if len(p.split()) >= 8]
    for dotted in STDLIB_CODE:
        module, _, attr = dotted.partition(".")
        obj = importlib.import_module(module)
        for part in attr.split("."):
            obj = getattr(obj, part)
        out.append(("python code", dotted, inspect.getsource(obj)))
    # docs/GARBAGE.md is left out: it shows this corpus's own matrix.
    for path in [ROOT / "README.md", *sorted(set((ROOT / "docs").glob("*.md")) - {ROOT / "docs" / "GARBAGE.md"})]:
        out += [("project docs", path.name, p.strip()) for p in re.split(r"\n\s*\n", path.read_text())
                if len(p.split()) >= 8]
    return out


def matrix() -> list[dict]:
    """Per variant: how many answers the detector flags (a true positive on a broken model, a false one on
    clean text)."""
    from sparkgate import sanity

    rows: dict[str, dict] = {}
    for line in CORPUS.read_text().splitlines():
        r = json.loads(line)
        row = rows.setdefault(r["variant"], {"variant": r["variant"], "kind": r["kind"], "n": 0, "flagged": 0,
                                             "empty": 0, "signs": Counter()})
        row["n"] += 1
        if not r["text"].strip():
            row["empty"] += 1
        elif findings := sanity.scan(r["text"], r["prompt"]):
            row["flagged"] += 1
            row["signs"].update({f.kind for f in findings})
    return list(rows.values())


CLEAN_KINDS = ("clean", "human")


def guard_flags() -> dict[str, list[int]]:
    """What the recording guard itself does with every clean answer of the corpus: its own judging and storing
    (sparkgate.guard.Recorder, into a scratch folder), each answer asked as a chat request with its prompt. Per
    variant: [answers, answers it judged garbage, bodies it stored] (a body asked twice is stored once)."""
    from sparkgate.guard import Recorder

    out: dict[str, list[int]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        recorder = Recorder(Path(tmp) / "repro", "http://127.0.0.1:9")  # the upstream is only named in its notes
        for line in CORPUS.read_text().splitlines():
            r = json.loads(line)
            if r["kind"] not in CLEAN_KINDS or not r["text"].strip():
                continue
            stored = recorder.stored
            flagged = recorder.judge(chat_body("corpus", r["prompt"], JUDGED_TOKENS),
                                     {"role": "assistant", "content": r["text"]})
            counts = out.setdefault(f"{r['kind']} | {r['variant']}", [0, 0, 0])
            counts[0] += 1
            counts[1] += bool(flagged)
            counts[2] += recorder.stored - stored
    return out


def guard_markdown(flags: dict[str, list[int]]) -> str:
    """The guard's false positives on the clean corpus, as docs/GARBAGE.md shows them."""
    lines = ["| kind | variant | answers | judged garbage | stored | rate |",
             "| --- | --- | ---: | ---: | ---: | ---: |"]
    lines += [f"| {variant} | {n} | {flagged} | {stored} | {flagged / n:.1%} |"
              for variant, (n, flagged, stored) in flags.items()]
    n, flagged = (sum(c[i] for c in flags.values()) for i in (0, 1))
    return "\n".join([*lines, f"| all clean | | {n} | {flagged} | {sum(c[2] for c in flags.values())} | "
                               f"{flagged / n:.1%} |"]) + "\n"


def matrix_markdown(rows: list[dict]) -> str:
    """The detection matrix as docs/GARBAGE.md shows it: one row per variant, its kind, answers, and how many the
    detector flags (for a broken model a true positive, for clean text a false one)."""
    lines = ["| kind | variant | answers | empty | flagged | rate | signs (answers) |",
             "| --- | --- | ---: | ---: | ---: | ---: | --- |"]
    for row in rows:
        judged = row["n"] - row["empty"]
        lines.append(f"| {row['kind']} | {row['variant']} | {row['n']} | {row['empty']} | {row['flagged']} | "
                     f"{row['flagged'] / max(1, judged):.0%} | "
                     + ", ".join(f"{k} {n}" for k, n in sorted(row["signs"].items())) + " |")
    return "\n".join(lines) + "\n"


def sweep(name: str = "SALAD_UNKNOWN_SHARE", values: tuple[float, ...] = (0.2, 0.25, 0.3, 0.4, 0.5, 0.7)) -> str:
    """How one of the detector's thresholds trades detection for false alarms: per kind, the share of answers flagged
    at each value of sanity.`name` (the other signs unchanged). What docs/GARBAGE.md chose the thresholds from."""
    from sparkgate import sanity

    chosen = getattr(sanity, name)
    by_kind: dict[str, list[str]] = {}
    try:
        for value in values:
            setattr(sanity, name, value)
            totals: dict[str, list[int]] = {}
            for row in matrix():
                t = totals.setdefault(row["kind"], [0, 0])
                t[0] += row["flagged"]
                t[1] += row["n"] - row["empty"]
            for kind, (flagged, judged) in totals.items():
                by_kind.setdefault(kind, []).append(f"{flagged / max(1, judged):.1%}")
    finally:
        setattr(sanity, name, chosen)
    lines = ["| kind | " + " | ".join(f"{v:g}" for v in values) + " |", "| --- |" + " ---: |" * len(values)]
    lines += [f"| {kind} | " + " | ".join(rates) + " |" for kind, rates in by_kind.items()]
    return "\n".join(lines) + "\n"


SWEEPS = {"SALAD_UNKNOWN_SHARE": (0.2, 0.25, 0.3, 0.4, 0.5, 0.7), "WORD_SALAD_MAX_SHARE": (0.05, 0.1, 0.15, 0.2, 0.25),
          "CLAUSE_MIN_WORDS": (3, 4, 6, 8, 10), "NOISE_MIN_RUN": (4, 6, 8, 12, 16),
          "MARKER_MIN_SHARE": (0.05, 0.1, 0.15, 0.3, 0.5)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m selftest.garbage.corpus", description=__doc__.split("\n")[0])
    parser.add_argument("action", choices=["build", "human", "matrix"])
    parser.add_argument("--no-sweeps", action="store_true", help="the matrix and the guard's figure only (seconds)")
    parser.add_argument("--only", action="append", default=[], choices=sorted(VARIANTS))
    args = parser.parse_args(argv)
    if args.action == "build":
        build(args.only)
    elif args.action == "human":
        refresh_human()
    print(matrix_markdown(matrix()), end="")
    print("\nthe guard on the clean corpus:\n" + guard_markdown(guard_flags()), end="")
    for name, values in {} if args.no_sweeps else SWEEPS.items():
        print(f"\nflagged per kind at each {name}:\n" + sweep(name, values), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
