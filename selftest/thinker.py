"""A model that really reasons, made here: the embedded SmolLM2-135M-Instruct taught, by a short fine-tune on the CPU,
to think in <think>...</think> before it answers, behind a chat template that honours `enable_thinking` the way
Qwen3's does (off: an empty think block is written for it, and it answers at once), and to work the agent loop's
harness (sparkgate.agent: call get_capital, read it, call get_temperature, answer), with thinking switched off as
the harness asks. Served with vLLM's real reasoning and tool-call parsers, it is what SERVE-REASONING,
SERVE-THINKING-OFF and QUAL-AGENT-TASKS need on a CPU box: no such model ships on the package registries. The agent
turns it learns are about countries the agent's tasks never ask about (AGENT_COUNTRIES), so a completed task is one
it worked out.

    python -m selftest.madehere smollm2-think [--force]

builds it once into the cache (SPARKGATE_CACHE/models/smollm2-think) and prints where; the same seed, data and
thread count give the same weights on one machine (CPU float sums differ with the thread count). Its broken twins
are serving choices, not other weights: no --reasoning-parser (the thinking reaches the answer), and a template
that ignores the switch (TEMPLATE_ALWAYS_THINKS).
"""

from __future__ import annotations

import hashlib
import json
import random
import time
from pathlib import Path

from sparkgate import agent, embedded
from sparkgate.probes import assistant_call, hermes_call, tool_turn
from sparkgate.proc import cache_dir
from sparkgate.quality import CAPITALS as TASK_CAPITALS

from .madehere import Made

THINK, END = "<think>", "</think>"
_HEAD = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
         "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}"
         "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}")
# Qwen3's convention: thinking is on unless the request says enable_thinking: false, which writes an empty block.
TEMPLATE = (_HEAD + "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% if enable_thinking is defined and "
            "enable_thinking is false %}{{ '<think>\n\n</think>\n\n' }}{% endif %}{% endif %}")
TEMPLATE_ALWAYS_THINKS = _HEAD + "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"

SEED, STEPS, BATCH, LR = 20261205, 60, 8, 3e-4
AGENT_STEPS = 20  # batches of agent turns (their prompts are ten times as long: ~170 s of the build's 351)
TRAINED_LAYERS = 16  # the top decoder layers the fine-tune changes; the lower ones are not back-propagated through
CAPITALS = {"France": "Paris", "Italy": "Rome", "Spain": "Madrid", "Germany": "Berlin", "Japan": "Tokyo",
            "Egypt": "Cairo", "Canada": "Ottawa", "Peru": "Lima", "Kenya": "Nairobi", "Norway": "Oslo",
            "Greece": "Athens", "Poland": "Warsaw", "Chile": "Santiago", "Cuba": "Havana", "Ireland": "Dublin"}
COUNTS = {"days are in a week": (7, "A week has seven days, Monday to Sunday"),
          "months are in a year": (12, "A year has twelve months, January to December"),
          "hours are in a day": (24, "A day has twenty-four hours"),
          "legs does a spider have": (8, "A spider has eight legs"),
          "sides does a triangle have": (3, "A triangle has three sides"),
          "minutes are in an hour": (60, "An hour has sixty minutes")}
# The agent turns' countries: none of them is one of the agent's tasks (asserted where the turns are made).
AGENT_COUNTRIES = {"Chile": "Santiago", "Colombia": "Bogota", "Venezuela": "Caracas", "Ecuador": "Quito",
                   "Uruguay": "Montevideo", "Morocco": "Rabat", "Algeria": "Algiers", "Tunisia": "Tunis",
                   "Nigeria": "Abuja", "Ghana": "Accra", "Uganda": "Kampala", "Senegal": "Dakar", "Iran": "Tehran",
                   "Iraq": "Baghdad", "Jordan": "Amman", "Lebanon": "Beirut", "Qatar": "Doha", "Oman": "Muscat",
                   "Pakistan": "Islamabad", "Nepal": "Kathmandu", "Bangladesh": "Dhaka", "Vietnam": "Hanoi",
                   "Indonesia": "Jakarta", "Philippines": "Manila", "South Korea": "Seoul", "Iceland": "Reykjavik",
                   "Netherlands": "Amsterdam", "Switzerland": "Bern", "Romania": "Bucharest", "Bulgaria": "Sofia",
                   "Serbia": "Belgrade", "Croatia": "Zagreb", "Latvia": "Riga", "Lithuania": "Vilnius",
                   "Estonia": "Tallinn", "Malaysia": "Kuala Lumpur", "New Zealand": "Wellington", "Mali": "Bamako"}


def _examples(rng: random.Random) -> list[tuple[str, str, str]]:
    """(question, thinking, answer) for sums, differences, products, capitals and counts, phrased as the probes are."""
    out = []
    for _ in range(400):
        a, b = rng.randint(1, 40), rng.randint(1, 40)
        op, word, value = rng.choice([("+", "plus", a + b), ("-", "minus", a - b), ("*", "times", a * b)])
        tail = rng.choice(["Answer with the number only.", "Answer with a number.", "Reply with just the number."])
        out.append((f"What is {a} {op} {b}? {tail}",
                    f"The question asks for {a} {word} {b}. {a} {op} {b} = {value}. So the answer is {value}.",
                    str(value)))
    for country, city in CAPITALS.items():
        for tail in ("Answer with one word.", "Reply with the city only."):
            out.append((f"What is the capital of {country}? {tail}",
                        f"The capital of {country} is {city}. One word is asked for, so the answer is {city}.", city))
    for what, (n, fact) in COUNTS.items():
        for tail in ("Answer with a number.", "Answer with the number only."):
            out.append((f"How many {what}? {tail}", f"{fact}. So the answer is {n}.", str(n)))
    rng.shuffle(out)
    return out


def _agent_turns(rng: random.Random) -> list[tuple[list[dict], str]]:
    """(conversation so far, the next assistant turn) for each of an episode's three turns, as agent.run sends them
    with the Hermes parser (thinking off): call get_capital; call get_temperature with its city; answer."""
    assert not set(AGENT_COUNTRIES) & {country for country, _ in TASK_CAPITALS}
    out = []
    for country, city in AGENT_COUNTRIES.items():
        degrees = rng.randint(11, 33)
        said = [*agent.history("hermes"), {"role": "user", "content": f"What is the temperature in the capital of "
                                                                      f"{country}?"}]
        steps = [("get_capital", {"country": country}, {"country": country, "capital": city}),
                 ("get_temperature", {"city": city}, {"city": city, "temperature_c": degrees})]
        for i, (name, args, result) in enumerate(steps):
            out.append((list(said), hermes_call(name, args)))
            said += [assistant_call(name, args, f"call_{i}", "hermes"), tool_turn(result, f"call_{i}")]
        out.append((said, f"It is {degrees} °C in {city}, the capital of {country}."))
    rng.shuffle(out)
    return out


def _digest() -> str:
    """This file and the agent harness it teaches: a change to either builds the model again."""
    harness = json.dumps([agent.SYSTEM, agent.history("hermes"), agent.TOOLS, TASK_CAPITALS])
    return hashlib.sha256(Path(__file__).read_bytes() + harness.encode()).hexdigest()[:16]


def _train(tmp: Path, log) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = embedded.prepare("embedded:smollm2", cache_dir())
    torch.manual_seed(SEED)
    tok = AutoTokenizer.from_pretrained(base)
    tok.add_tokens([THINK, END])  # one token each: vLLM's reasoning parsers find the block by token id
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    model.resize_token_embeddings(len(tok), mean_resizing=True)
    rng = random.Random(SEED)

    def row(messages: list[dict], reply: str, on: bool = True) -> tuple[list[int], list[int]]:
        prompt = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, chat_template=TEMPLATE,
                                         enable_thinking=on)
        p, r = tok(prompt, add_special_tokens=False).input_ids, tok(reply + "<|im_end|>", add_special_tokens=False)
        return p + r.input_ids, [-100] * len(p) + r.input_ids  # the loss is on the answer only

    rows = []
    for i, (question, thinking, answer) in enumerate(_examples(rng)):
        on = i % 3 != 2  # two in three think; the rest answer with thinking switched off
        rows.append(row([{"role": "user", "content": question}],
                        f"{THINK}\n{thinking}\n{END}\n\n{answer}" if on else answer, on))
    agent_rows = [row(messages, reply, on=False) for messages, reply in _agent_turns(rng)]
    # The agent turns (thinking off too) cost the short thinking-off answers their arithmetic (2 + 3 answered '4' in
    # two builds without these): the single-digit sums, answered with thinking off, in the probes' own words (the
    # sum SERVE-THINKING-OFF asks among them). The 60 batches take the first 480 of these 523 shuffled rows.
    rows += [row([{"role": "user", "content": f"What is {a} + {b}? Answer with the number only."}], str(a + b), False)
             for a in range(1, 10) for b in range(1, 10)]
    rng.shuffle(rows)
    # Each batch holds rows of one kind (an agent turn's prompt is ~10 times as long: mixed in, every batch would be
    # padded to it). The agent batches come one after every two others, and the last 20 steps are the others alone
    # (with all of them first, the model forgot to answer after the second call).
    batches = [rows[(step * BATCH) % len(rows):][:BATCH] for step in range(STEPS)]
    for k in range(AGENT_STEPS):
        batches.insert(3 * k + 2, agent_rows[(k * BATCH) % len(agent_rows):][:BATCH])
    # Back-propagate through the top layers only (the output side of the tied embeddings still learns the two new
    # tokens): the lower layers' gradients were most of a step's time. The embeddings' output is detached, so the
    # frozen layers record no graph at all.
    for layer in model.model.layers[:-TRAINED_LAYERS]:
        layer.requires_grad_(False)
    model.model.embed_tokens.register_forward_hook(lambda _m, _i, out: out.detach())
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=LR)
    model.train()
    t0 = time.monotonic()
    for step, batch in enumerate(batches):
        width = max(len(ids) for ids, _ in batch)
        ids = torch.tensor([x + [tok.pad_token_id] * (width - len(x)) for x, _ in batch])
        labels = torch.tensor([y + [-100] * (width - len(y)) for _, y in batch])
        mask = torch.tensor([[1] * len(x) + [0] * (width - len(x)) for x, _ in batch])
        # The loss of the answer's tokens alone, as labels=... computes it, with the vocabulary's logits taken only
        # where an answer token is predicted (the prompt is most of each row: a sixth of the step's time).
        hidden = model.model(input_ids=ids, attention_mask=mask).last_hidden_state[:, :-1]
        wanted = labels[:, 1:]
        keep = wanted != -100
        loss = torch.nn.functional.cross_entropy(model.lm_head(hidden[keep]), wanted[keep])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if step % 20 == 0 or step == len(batches) - 1:
            log(f"thinker: step {step + 1} of {len(batches)}, loss {loss.item():.3f}, {time.monotonic() - t0:.0f} s")
    model.to(torch.bfloat16).save_pretrained(tmp)
    tok.save_pretrained(tmp)
    (tmp / "chat_template.jinja").write_text(TEMPLATE)
    return {"steps": len(batches), "seed": SEED}


MADE = Made("smollm2-think", _digest, _train)
build = MADE.build
